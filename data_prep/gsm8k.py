"""Prepare GSM8K for verl 0.9.1: ``train.parquet`` / ``test.parquet`` in RLHFDataset's row schema.

    python -m data_prep.gsm8k --source /path/to/gsm8k --out-dir ~/data/gsm8k

Sources: the Hugging Face hub (``openai/gsm8k``, config ``main``, the default), a directory with
OpenAI's original ``train.jsonl`` / ``test.jsonl``, or a directory in the hub's parquet layout
(``main/train-00000-of-00001.parquet``, or the same files at its top level).

Every source row is validated before anything is written; a bad row stops the run with one line
naming the file and the 1-based line (jsonl) or row (parquet), exit code 2. Every output location
is checked before anything is written; outputs (``--out-dir`` and ``--hub-layout-dir`` together)
are written to temporary files beside their targets and only then moved into place with
``os.replace`` (``replace_all`` of verl_gsm8k/common/atomic_io.py, the project's one atomic
writer), so a failed or interrupted run (Ctrl-C: one line, exit code 130) leaves earlier outputs
intact. The same input gives byte-identical files.

Other code imports the single source of truth for prompts from here: ``PROMPT_STYLES`` (templates
in ``str.format`` syntax with one ``{question}`` field, literal braces doubled, the convention
EvalScope's ``prompt_template`` uses too) and ``build_prompt``. ``data_prep.sft`` (the same
problems as chat transcripts for supervised fine-tuning) reuses the reading and validation
(``load_source``), the prompts, and the writing (``parquet_writer``, with ``replace_all``).
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from rewards import gsm8k as reward
from verl_gsm8k.common import json_read
from verl_gsm8k.common.atomic_io import NotWritable, Writers, replace_all

PROG = "data_prep.gsm8k"
HUB_ID = "openai/gsm8k"
HUB_CONFIG = "main"
DATA_SOURCE = "openai/gsm8k"  # verl's built-in reward routes this data_source to its GSM8K scorer
ABILITY = "math"
SPLITS: tuple[str, ...] = ("train", "test")
DEFAULT_OUT_DIR = "~/data/gsm8k"

PROMPT_STYLES: dict[str, str] = {
    # verl's own GSM8K instruction (note the leading space); answers are read after "#### ".
    "hash": '{question} Let\'s think step by step and output the final answer after "####".',
    # The instruction of EvalScope's gsm8k benchmark (its 0-shot prompt, character for character).
    "boxed": "{question}\nPlease reason step by step, and put your final answer within "
    "\\boxed{{}}.",
}
DEFAULT_PROMPT_STYLE = "hash"

# A ground truth: an optional sign ("- 5" is -5, as the reward reads it), then "1,234" (groups of
# three only) or "1234", then an optional ".5".
_NUMBER = re.compile(r"(-) ?((?:[0-9]{1,3}(?:,[0-9]{3})+|[0-9]+)(?:\.[0-9]+)?)|"
                     r"((?:[0-9]{1,3}(?:,[0-9]{3})+|[0-9]+)(?:\.[0-9]+)?)")  # fmt: skip
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")  # "name" or "owner/name"
_MARKER = "####"

Row = dict[str, str]


class DataPrepError(ValueError):
    """A user-facing error: bad source, malformed row, unwritable output. One line, no traceback."""


def build_prompt(question: str, style: str = DEFAULT_PROMPT_STYLE) -> str:
    """The user message for ``question`` in prompt style ``style`` (a key of PROMPT_STYLES)."""
    try:
        template = PROMPT_STYLES[style]
    except KeyError:
        raise ValueError(
            f"unknown prompt style {style!r}; known: {', '.join(PROMPT_STYLES)}"
        ) from None
    return template.format(question=question)


def ground_truth(answer: str) -> str:
    """The number after the last ``####`` of a GSM8K solution, commas removed ("1,080" -> "1080").

    Raises ValueError when there is no ``####``, what follows it is not a plain number (a sign,
    which one space may follow, as the reward reads it; thousands in groups of three) or no
    response could match it (the reward, rewards/gsm8k.py, given that answer line, does not
    credit it: a number longer than it reads, say).
    """
    _, marker, tail = answer.rpartition(_MARKER)
    if not marker:
        raise ValueError(f"answer has no '{_MARKER} <number>' line")
    value = tail.strip()
    match = _NUMBER.fullmatch(value)
    shown = value if len(value) <= 40 else value[:37] + "..."
    if not match:
        raise ValueError(f"answer after '{_MARKER}' is not a number: {shown!r}")
    truth = (match[1] or "") + (match[2] or match[3]).replace(",", "")
    said = f"{_MARKER} {value}"  # the reference answer line, as a response would write it
    if len(value) > reward.ANSWER_WINDOW or reward.compute_score(None, said, truth)["acc"] != 1.0:
        raise ValueError(
            f"answer after '{_MARKER}' is a number no response can match: {shown!r} (the reward "
            f"reads {reward.ANSWER_WINDOW} characters of an answer line)"
        )
    return truth


# ---------------------------------------------------------------------------------------------
# Reading sources


def _validate(raw: Any, where: str) -> Row:
    """One source row -> {"question", "answer"}; DataPrepError naming ``where`` if malformed."""
    if not isinstance(raw, dict):
        raise DataPrepError(f"{where}: row is not a JSON object")
    row: Row = {}
    for field in ("question", "answer"):
        value = raw.get(field)
        if value is None or (isinstance(value, str) and not value.strip()):
            raise DataPrepError(f"{where}: missing or empty '{field}' field")
        if not isinstance(value, str):
            raise DataPrepError(f"{where}: '{field}' is not a string ({type(value).__name__})")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as err:  # a lone surrogate ("\ud800"): JSON allows it, UTF-8 not
            raise DataPrepError(
                f"{where}: '{field}' is not valid Unicode text (lone surrogate "
                f"{value[err.start]!r} at character {err.start + 1})"
            ) from None
        row[field] = value
    try:
        ground_truth(row["answer"])
    except ValueError as err:
        raise DataPrepError(f"{where}: {err}") from None
    return row


def _read_jsonl(path: Path, limit: int | None) -> list[Row]:
    try:
        data = path.read_bytes()
    except OSError as err:
        raise DataPrepError(f"{path}: cannot read ({one_line(err)})") from None
    rows: list[Row] = []
    for number, raw_line in enumerate(data.split(b"\n"), start=1):
        if limit is not None and len(rows) >= limit:
            break
        where = f"{path}:{number}"
        try:
            line = raw_line.decode("utf-8")
        except UnicodeDecodeError:
            raise DataPrepError(f"{where}: not UTF-8 text") from None
        if not line.strip():
            continue  # blank lines (a trailing newline, say) carry no row
        try:
            raw = json_read.parse(line, where)
        except json_read.JsonError as err:
            raise DataPrepError(f"{where}: invalid JSON ({err.reason})") from None
        rows.append(_validate(raw, where))
    return rows


def _read_parquet(path: Path, limit: int | None) -> list[Row]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        names = pq.read_schema(path).names
        missing = [c for c in ("question", "answer") if c not in names]
        if missing:
            raise DataPrepError(f"{path}: no column {missing[0]!r} (columns: {', '.join(names)})")
        table = pq.read_table(path, columns=["question", "answer"])
    except (pa.ArrowException, OSError) as err:
        raise DataPrepError(f"{path}: not a readable parquet file ({one_line(err)})") from None
    if limit is not None:
        table = table.slice(0, limit)
    return [_validate(raw, f"{path}:row {i}") for i, raw in enumerate(table.to_pylist(), start=1)]


def _split_files(root: Path, split: str) -> list[Path]:
    """The files holding ``split`` in a source directory: jsonl first, else hub parquet shards."""
    jsonl = root / f"{split}.jsonl"
    if jsonl.is_file():
        return [jsonl]
    for folder in (root / HUB_CONFIG, root):
        shards = sorted(folder.glob(f"{split}-*-of-*.parquet"))
        if shards:
            return shards
    raise DataPrepError(
        f"{root}: no {split}.jsonl, {HUB_CONFIG}/{split}-00000-of-00001.parquet "
        f"or {split}-00000-of-00001.parquet"
    )


def _load_dir(root: Path, limit: int | None, splits: Sequence[str]) -> dict[str, list[Row]]:
    out: dict[str, list[Row]] = {}
    for split in splits:
        rows: list[Row] = []
        files = _split_files(root, split)
        for path in files:
            left = None if limit is None else limit - len(rows)
            if left == 0:
                break
            reader = _read_jsonl if path.suffix == ".jsonl" else _read_parquet
            rows.extend(reader(path, left))
        if not rows:
            raise DataPrepError(f"{files[0]}: no rows")
        out[split] = rows
    return out


def hub_unreachable(timeout: float = 3.0) -> str | None:
    """Why the hub ($HF_ENDPOINT) cannot be reached, or None if it can (or a proxy is set).

    A quick TCP probe, so that an offline machine fails in seconds, not after the hub client's
    retries (~25 s). No probe with a proxy configured (it would prove nothing).
    """
    if any(os.environ.get(k) for k in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return None
    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname or "huggingface.co", port), timeout=timeout).close()
    except OSError as exc:
        return str(exc) or type(exc).__name__
    return None


def _load_hub(source: str, limit: int | None, splits: Sequence[str]) -> dict[str, list[Row]]:
    offline = os.environ.get("HF_HUB_OFFLINE", "0").lower() not in ("", "0", "false", "no", "off")
    if not offline and hub_unreachable() is not None:
        # Offline mode still serves a copy from the local datasets cache, and fails fast otherwise.
        os.environ["HF_HUB_OFFLINE"] = "1"
        os.environ["HF_DATASETS_OFFLINE"] = "1"
    try:
        import datasets

        loaded = datasets.load_dataset(source, HUB_CONFIG)
        tables = {split: loaded[split] for split in splits}
    except Exception as err:  # the hub raises many types; all mean "not available here"
        raise DataPrepError(
            f"could not load {source!r} (config {HUB_CONFIG!r}) from the Hugging Face hub "
            f"({one_line(err)}); without network use --source DIR, a directory with "
            "train.jsonl/test.jsonl or the hub parquet layout"
        ) from None
    out: dict[str, list[Row]] = {}
    for split, table in tables.items():
        if limit is not None:
            table = table.select(range(min(limit, len(table))))
        where = f"{source} ({HUB_CONFIG}, {split})"
        out[split] = [_validate(raw, f"{where}:row {i}") for i, raw in enumerate(table, start=1)]
    return out


def load_source(
    source: str, limit: int | None = None, splits: Sequence[str] = SPLITS
) -> dict[str, list[dict[str, str]]]:
    """Read and validate GSM8K from ``source``: split -> rows ``{"question", "answer"}``.

    ``source`` is an existing directory (original jsonl, or hub parquet layout) or a hub dataset id.
    ``limit`` keeps the first N rows of each split. Raises DataPrepError on any malformed row.
    """
    if limit is not None and limit < 1:
        raise DataPrepError(f"--limit must be at least 1, got {limit}")
    unknown = [s for s in splits if s not in SPLITS]
    if unknown:
        raise DataPrepError(f"unknown split {unknown[0]!r}; known: {', '.join(SPLITS)}")
    path = Path(source).expanduser()
    if path.exists():
        if not path.is_dir():
            raise DataPrepError(f"{path}: --source must be a directory or a hub dataset id")
        return _load_dir(path, limit, splits)
    if not _HUB_ID.fullmatch(source):
        raise DataPrepError(f"{path}: no such directory (nor a hub dataset id like {HUB_ID})")
    return _load_hub(source, limit, splits)


# ---------------------------------------------------------------------------------------------
# Writing


def verl_rows(rows: Sequence[Row], split: str, style: str = DEFAULT_PROMPT_STYLE) -> list[dict]:
    """Source rows -> rows in verl 0.9.1 RLHFDataset's schema (index = 0-based row in its split)."""
    return [
        {
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": build_prompt(row["question"], style)}],
            "ability": ABILITY,
            "reward_model": {"style": "rule", "ground_truth": ground_truth(row["answer"])},
            "extra_info": {
                "split": split,
                "index": index,
                "question": row["question"],
                "answer": row["answer"],
            },
        }
        for index, row in enumerate(rows)
    ]


def _verl_schema():
    import pyarrow as pa

    text = pa.string()
    return pa.schema(
        [
            ("data_source", text),
            ("prompt", pa.list_(pa.struct([("role", text), ("content", text)]))),
            ("ability", text),
            ("reward_model", pa.struct([("style", text), ("ground_truth", text)])),
            (
                "extra_info",
                pa.struct(
                    [("split", text), ("index", pa.int64()), ("question", text), ("answer", text)]
                ),
            ),
        ]
    )


def parquet_writer(records: list[dict], schema: Any) -> Callable[[Path], None]:
    """A writer for ``replace_all``: the same records and schema always give the same bytes."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist(records, schema=schema)
    return lambda path: pq.write_table(table, path, compression="snappy")


def _verl_writers(splits: dict[str, list[Row]], out_dir: Path, style: str) -> Writers:
    schema = _verl_schema()
    return {
        out_dir / f"{split}.parquet": parquet_writer(verl_rows(rows, split, style), schema)
        for split, rows in splits.items()
    }


def write_verl_splits(
    splits: dict[str, list[dict[str, str]]], out_dir: Path, style: str = DEFAULT_PROMPT_STYLE
) -> dict[str, Path]:
    """Write ``<out_dir>/<split>.parquet`` for each split, atomically; returns split -> path."""
    out_dir = Path(out_dir).expanduser()
    replace_all(_verl_writers(splits, out_dir, style))
    return {split: out_dir / f"{split}.parquet" for split in splits}


def _hub_readme(splits: Sequence[str]) -> str:
    files = "".join(
        f"  - split: {split}\n    path: {HUB_CONFIG}/{split}-00000-of-00001.parquet\n"
        for split in splits
    )
    return (
        f"---\nconfigs:\n- config_name: {HUB_CONFIG}\n  data_files:\n{files}---\n\n"
        f"# GSM8K ({HUB_ID}, config {HUB_CONFIG}), local copy\n\n"
        f"Written by `python -m {PROG} --hub-layout-dir` in the hub's layout, so that tools which\n"
        "load the hub dataset (EvalScope, `datasets.load_dataset(DIR, 'main')`) read it offline.\n"
        "GSM8K is (c) OpenAI, released under the MIT licence.\n"
    )


def write_hub_layout(splits: dict[str, list[dict[str, str]]], out_dir: Path) -> Path:
    """Write the hub's ``openai/gsm8k`` layout (config ``main``) under ``out_dir``; returns it.

    ``main/<split>-00000-of-00001.parquet`` (columns question, answer) for each split, and a
    README.md whose YAML header declares config ``main`` with those data_files (EvalScope and
    ``datasets`` need it to find the config offline).
    """
    out_dir = Path(out_dir).expanduser()
    replace_all(_hub_writers(splits, out_dir))
    return out_dir


def _hub_writers(splits: dict[str, list[Row]], out_dir: Path) -> Writers:
    import pyarrow as pa

    schema = pa.schema([("question", pa.string()), ("answer", pa.string())])
    readme = _hub_readme(list(splits)).encode("utf-8")
    writers: Writers = {
        out_dir / HUB_CONFIG / f"{split}-00000-of-00001.parquet": parquet_writer(
            [{"question": r["question"], "answer": r["answer"]} for r in rows], schema
        )
        for split, rows in splits.items()
    }
    writers[out_dir / "README.md"] = lambda path: path.write_bytes(readme)
    return writers


def write_all(
    splits: dict[str, list[dict[str, str]]],
    out_dir: Path,
    style: str = DEFAULT_PROMPT_STYLE,
    hub_dir: Path | None = None,
) -> dict[str, Path]:
    """``write_verl_splits`` and, with ``hub_dir``, ``write_hub_layout`` as ONE atomic step.

    Every output location is checked, and every file written to a temp file, before the first
    one is replaced: an unwritable ``hub_dir`` leaves ``out_dir`` as it was. Returns split -> path.
    """
    out_dir = Path(out_dir).expanduser()
    writers = _verl_writers(splits, out_dir, style)
    if hub_dir is not None:
        writers |= _hub_writers(splits, Path(hub_dir).expanduser())
    replace_all(writers)
    return {split: out_dir / f"{split}.parquet" for split in splits}


# ---------------------------------------------------------------------------------------------
# CLI


def one_line(err: BaseException) -> str:
    text = " ".join(str(err).split()) or type(err).__name__
    return text if len(text) <= 200 else text[:197] + "..."


def _int_at_least(text: str, low: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
    return value


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    return _int_at_least(text, 1)


def non_negative_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    return _int_at_least(text, 0)


def read_and_write(
    prog: str,
    source: str,
    limit: int | None,
    splits: Sequence[str],
    write: Callable[[dict[str, list[Row]]], dict[str, Path]],
) -> tuple[dict[str, list[Row]], dict[str, Path]] | int:
    """The data_prep CLIs' core: load and validate every row of ``source``, then ``write`` them
    (all outputs or none). Returns (rows by split, written paths), or the exit code after one
    line on stderr: 2 for bad input or a failed write, 130 when interrupted."""
    try:
        data = load_source(source, limit=limit, splits=splits)
        counts = ", ".join(f"{len(rows)} {split}" for split, rows in data.items())
        print(f"{prog}: read {counts} rows from {source}; writing...", flush=True)
        return data, write(data)
    except (DataPrepError, NotWritable) as err:
        print(f"{prog}: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # full disk, a file vanishing under us, ...
        print(f"{prog}: cannot write output: {one_line(err)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(
            f"{prog}: interrupted; outputs are replaced all together or not at all", file=sys.stderr
        )
        return 130


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=f"python -m {PROG}",
        description="Prepare GSM8K as train.parquet/test.parquet rows for verl 0.9.1 "
        "(RLHFDataset schema). Every row is validated before anything is written.",
    )
    parser.add_argument(
        "--source",
        default=HUB_ID,
        help=f"where GSM8K comes from: a hub dataset id (default {HUB_ID}, config {HUB_CONFIG}, "
        "needs network or a datasets cache), or a directory holding OpenAI's "
        "train.jsonl/test.jsonl "
        f"or the hub parquet layout ({HUB_CONFIG}/train-00000-of-00001.parquet, ... "
        "or those files at its top level)",
    )
    parser.add_argument(
        "--out-dir",
        default=DEFAULT_OUT_DIR,
        help=f"directory for train.parquet and test.parquet (default {DEFAULT_OUT_DIR}; "
        "created if missing; existing files are replaced atomically)",
    )
    parser.add_argument(
        "--prompt-style",
        choices=list(PROMPT_STYLES),
        default=DEFAULT_PROMPT_STYLE,
        help="instruction appended to each question: 'hash' (default; verl's 'Let's think step "
        "by step and output the final answer after \"####\".') or 'boxed' (final answer "
        "within \\boxed{}, EvalScope's gsm8k instruction)",
    )
    parser.add_argument(
        "--limit",
        type=positive_int,
        metavar="N",
        help="keep only the first N rows of each split (for quick runs)",
    )
    parser.add_argument(
        "--splits",
        nargs="+",
        choices=list(SPLITS),
        default=list(SPLITS),
        metavar="SPLIT",
        help="splits to prepare, of: train test (default: both)",
    )
    parser.add_argument(
        "--hub-layout-dir",
        metavar="DIR",
        help=f"also write the rows in the hub's layout ({HUB_CONFIG}/<split>-00000-of-00001.parquet"
        f" + README.md) to DIR, for offline EvalScope: --dataset-args "
        '\'{"gsm8k":{"dataset_id":"DIR"}}\'',
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    start = time.perf_counter()
    splits = list(dict.fromkeys(args.splits))  # de-duplicated, order kept
    out_dir = Path(args.out_dir).expanduser()
    hub_dir = Path(args.hub_layout_dir).expanduser() if args.hub_layout_dir else None
    done = read_and_write(
        PROG,
        args.source,
        args.limit,
        splits,
        lambda data: write_all(data, out_dir, args.prompt_style, hub_dir),
    )
    if isinstance(done, int):
        return done
    data, paths = done
    print(f"{PROG}: source {args.source}, prompt style {args.prompt_style}")
    for split, path in paths.items():
        print(f"  {split}: {len(data[split])} rows -> {path}")
    if hub_dir is not None:
        print(f"  hub layout ({HUB_CONFIG}, {', '.join(data)}) -> {hub_dir}")
    print(f"{PROG}: done in {time.perf_counter() - start:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
