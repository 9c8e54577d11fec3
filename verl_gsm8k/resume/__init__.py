"""What a launch resumes, before verl starts: the checkpoint verified (verify.py), the
same-config check (same_config.py), the launch record."""
