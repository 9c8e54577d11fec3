"""What each launch was, recorded in its run directory, and the guard against resuming another run.

``python -m verl_gsm8k.launch`` is run by ``recipes/common.sh`` right before verl starts (not on a
dry run): it composes the launch's config against the installed verl (as ``--cfg job`` would),
verifies the checkpoint verl would resume (``verify.py``), refuses to resume it when the launch
that wrote it had another config, every key compared but the few that may change on a resume
(``resume.py``, docs/resume.md), then writes ``RUN_DIR/launches/launch-<UTC>.yaml``
(``record.py``): one file per launch, never overwritten, read by the run comparison and by later
launches' guard.
"""
