"""Data preparation for verl: GSM8K as the parquet rows RLHFDataset reads (docs/data.md)."""
