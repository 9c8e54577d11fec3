"""What a launch resumes, decided before verl starts (``python -m verl_gsm8k.resume``, run by the
launcher): the checkpoint verified (verify.py), the same-config check (same_config.py), the launch
record (common/launch_record.py)."""
