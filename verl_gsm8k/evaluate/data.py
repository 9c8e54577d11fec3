"""GSM8K for EvalScope: any supported source read once, written in the hub layout EvalScope reads
offline (``OUT/data/gsm8k-<content hash>/``), so it never touches a hub."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from verl_gsm8k.evaluate.settings import UsageError


def load_data(source: str, modes: list[str]) -> dict[str, list[dict]]:
    """``{split: [{question, answer}]}`` from ``source`` (writes nothing)."""
    from data_prep.gsm8k import DataPrepError, load_source

    path = Path(source).expanduser()
    hub = (path / "main").is_dir() or any(path.glob("test-*-of-*.parquet"))
    try:
        if (path / "test.parquet").is_file() and not (path / "test.jsonl").exists() and not hub:
            splits = _verl_parquet(path)
        else:
            splits = load_source(source)
    except DataPrepError as err:
        raise UsageError(f"--data: {err}") from None
    if not splits.get("test"):
        raise UsageError(f"--data {source}: the test split is empty")
    if "evalscope" in modes and len(splits.get("train") or []) < 4:
        raise UsageError(f"--data {source}: evalscope mode needs >= 4 train rows (4-shot)")
    return splits


def write_data(splits: dict[str, list[dict]], data_root: Path) -> Path:
    """The hub layout, in a directory named by its content: ``datasets`` caches a local dataset
    by its base name and config only, so a second directory named ``gsm8k`` would silently be
    served the first one's rows."""
    from data_prep.gsm8k import write_hub_layout

    rows = {k: [[r["question"], r["answer"]] for r in v] for k, v in sorted(splits.items())}
    digest = hashlib.sha256(json.dumps(rows, ensure_ascii=False).encode()).hexdigest()[:12]
    return write_hub_layout(splits, data_root / f"gsm8k-{digest}")


def _verl_parquet(path: Path) -> dict[str, list[dict]]:
    """data_prep's verl ``<split>.parquet``: the original question and answer in extra_info."""
    import pyarrow.parquet as pq

    out: dict[str, list[dict]] = {}
    for split in ("train", "test"):
        file = path / f"{split}.parquet"
        if not file.is_file():
            continue
        out[split] = []
        for i, rec in enumerate(pq.read_table(file).to_pylist(), start=1):
            info = rec.get("extra_info") or {}
            if not info.get("question") or not info.get("answer"):
                raise UsageError(
                    f"--data {file}: row {i} has no extra_info.question/answer (not a "
                    "data_prep.gsm8k output); pass the original jsonl or hub layout instead"
                )
            out[split].append({"question": info["question"], "answer": info["answer"]})
    return out
