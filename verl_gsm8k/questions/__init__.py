"""Which questions changed: one row per question, one column per model or step."""
