"""What each launch was, recorded in its run directory, and the guard against resuming another run.

``python -m verl_gsm8k.launch`` is run by ``recipes/common.sh`` right before verl starts (not on a
dry run): it composes the launch's config against the installed verl (as ``--cfg job`` would),
refuses to resume a checkpoint that another model, algorithm or learning rate wrote
(``resume.py``), then writes ``RUN_DIR/launches/launch-<UTC>.yaml`` (``record.py``): one file per
launch, never overwritten, read by the run comparison and by the next launch's guard.
"""
