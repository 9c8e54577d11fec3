"""What a launch resumes, decided before verl starts: which checkpoint, whether it may, and the
record a later resume is compared with.

Named ``resume`` because every step of ``python -m verl_gsm8k.resume`` serves that decision; it
launches nothing (the launcher is ``verl_gsm8k/launch/``, which runs it right before verl, not on
a dry run). It composes the launch's config against the installed verl (as ``--cfg job`` would),
verifies the checkpoint verl would resume and falls back to the newest whole one (``verify.py``),
refuses to resume it when the launch that wrote it had another config, every key compared but the
few that may change on a resume (``same_config.py``, docs/resume.md), then writes
``RUN_DIR/launches/launch-<UTC>.yaml`` (with ``verl_gsm8k/common/launch_record.py``): one file per
launch, fresh runs included, never overwritten, read by later launches' same-config check and by
the run comparison.
"""
