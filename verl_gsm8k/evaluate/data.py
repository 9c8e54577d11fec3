"""GSM8K read once, written where EvalScope reads it offline: ``OUT/data/gsm8k-<content hash>/``."""

import hashlib
import json
from pathlib import Path

from verl_gsm8k.evaluate.settings import UsageError


def load_data(source: str, modes: list[str]) -> dict[str, list[dict]]:
    """``{split: [{question, answer}]}``."""
    import pyarrow.parquet as pq

    from data_prep.gsm8k import DataPrepError, load_source

    path = Path(source).expanduser()
    hub = (path / "main").is_dir() or any(path.glob("test-*-of-*.parquet"))
    verl = (path / "test.parquet").is_file() and not (path / "test.jsonl").exists() and not hub
    try:
        splits = load_source(source) if not verl else {}
    except DataPrepError as err:
        raise UsageError(f"--data: {err}") from None
    for file in [path / f"{split}.parquet" for split in ("train", "test")] if verl else []:
        if not file.is_file():
            continue
        rows = [r.get("extra_info") or {} for r in pq.read_table(file).to_pylist()]
        for i, row in enumerate(rows, 1):
            if not row.get("question") or not row.get("answer"):
                why = "no extra_info.question/answer (not data_prep.gsm8k's)"
                raise UsageError(f"--data {file}: row {i} has {why}; pass the jsonl or hub layout")
        splits[file.stem] = [{"question": r["question"], "answer": r["answer"]} for r in rows]
    if not splits.get("test"):
        raise UsageError(f"--data {source}: the test split is empty")
    if "evalscope" in modes and len(splits.get("train") or []) < 4:
        raise UsageError(f"--data {source}: evalscope mode needs >= 4 train rows (4-shot)")
    return splits


def write_data(splits: dict[str, list[dict]], data_root: Path) -> Path:
    """The hub layout, in a directory named by its content (``datasets`` caches by base name)."""
    from data_prep.gsm8k import write_hub_layout

    rows = {k: [[r["question"], r["answer"]] for r in v] for k, v in sorted(splits.items())}
    digest = hashlib.sha256(json.dumps(rows, ensure_ascii=False).encode()).hexdigest()[:12]
    return write_hub_layout(splits, data_root / f"gsm8k-{digest}")
