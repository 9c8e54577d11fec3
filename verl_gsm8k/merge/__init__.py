"""verl FSDP checkpoint -> verified Hugging Face model (run through scripts/merge.sh)."""
