"""GSM8K data for EvalScope: read any supported source once, write the hub layout it reads
offline (``OUT/data/gsm8k-<content hash>/``)."""

from __future__ import annotations

import json
from pathlib import Path

from verl_gsm8k.evaluate.settings import UsageError


def load_data(source: str) -> dict[str, list[dict]]:
    """Read GSM8K from ``source`` (writes nothing): ``{split: [{question, answer}]}``."""
    from data_prep.gsm8k import DataPrepError, load_source

    path = Path(source).expanduser()
    try:
        if path.is_dir() and _is_verl_parquet_dir(path):
            splits = _load_verl_parquet_dir(path)
        else:
            splits = load_source(source)
    except DataPrepError as err:
        raise UsageError(f"--data: {err}") from None
    if not splits.get("test"):
        raise UsageError(f"--data {source}: the test split is empty")
    return splits


def write_data(splits: dict[str, list[dict]], data_root: Path) -> Path:
    """Write the hub layout EvalScope reads offline; returns its directory.

    The directory is named ``gsm8k-<content hash>``: ``datasets`` caches a local dataset
    directory under its base name and config only (``~/.cache/huggingface/datasets/<name>/main/
    0.0.0/<fixed hash>``), so a directory named just ``gsm8k`` would silently be served the rows
    of whichever ``gsm8k`` directory was loaded first. A content-derived name makes that cache
    correct by construction.
    """
    import hashlib

    from data_prep.gsm8k import write_hub_layout

    canonical = json.dumps(
        {k: [[r["question"], r["answer"]] for r in v] for k, v in sorted(splits.items())},
        ensure_ascii=False,
    )
    digest = hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:12]
    return write_hub_layout(splits, data_root / f"gsm8k-{digest}")


def _is_verl_parquet_dir(path: Path) -> bool:
    hub = (path / "main").is_dir() or any(path.glob("test-*-of-*.parquet"))
    return (path / "test.parquet").is_file() and not (path / "test.jsonl").exists() and not hub


def _load_verl_parquet_dir(path: Path) -> dict[str, list[dict]]:
    """verl's prepared ``<split>.parquet``: the original question/answer are in extra_info."""
    import pyarrow.parquet as pq

    out: dict[str, list[dict]] = {}
    for split in ("train", "test"):
        file = path / f"{split}.parquet"
        if not file.is_file():
            continue
        rows = []
        for i, rec in enumerate(pq.read_table(file).to_pylist(), start=1):
            info = rec.get("extra_info") or {}
            if not info.get("question") or not info.get("answer"):
                raise UsageError(
                    f"--data {file}: row {i} has no extra_info.question/answer (not a "
                    "data_prep.gsm8k output); pass the original jsonl or hub layout instead"
                )
            rows.append({"question": info["question"], "answer": info["answer"]})
        out[split] = rows
    return out
