"""GSM8K as verl 0.9.1's RLHFDataset rows: ``train.parquet`` / ``test.parquet`` (docs/data.md).

    python -m data_prep.gsm8k --source /path/to/gsm8k --out-dir ~/data/gsm8k

Sources: the hub (``openai/gsm8k``, config ``main``), a directory with OpenAI's
``train.jsonl``/``test.jsonl``, or one in the hub's parquet layout. Every row is validated first:
a bad one stops the run with one line naming the file and line (or row), exit 2. Every output is
written to a temporary file and all are renamed together (common/atomic_io.py): a failure or
Ctrl-C (exit 130) leaves earlier outputs as they were. The same input gives the same bytes.
``PROMPT_STYLES`` and ``build_prompt`` are the one home of the prompts.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import sys
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from rewards import gsm8k as reward
from verl_gsm8k.common.atomic_io import NotWritable, Writers, replace_all

HUB_ID, HUB_CONFIG = "openai/gsm8k", "main"
DATA_SOURCE = "openai/gsm8k"  # verl's built-in reward routes this data_source to its GSM8K scorer
SPLITS = ("train", "test")
PROMPT_STYLES = {
    # verl's own GSM8K instruction (note the leading space)
    "hash": '{question} Let\'s think step by step and output the final answer after "####".',
    # EvalScope's gsm8k instruction, character for character
    "boxed": "{question}\nPlease reason step by step, and put your final answer within "
    "\\boxed{{}}.",
}
# --tools: the system turn of a tool row (configs/tools/<name>.yaml), which says when to call the
# tool and where the answer goes; the chat template adds the tool's schema and how to call it.
TOOL_PROMPTS = {
    "calculator": "Use the calculator tool for every computation, then write the final answer "
    'after "####".',
}
# A ground truth: a sign (one space may follow it, as the reward reads it), then "1,234"
# (groups of three) or "1234", then an optional ".5".
_NUMBER = re.compile(r"(-)? ?((?:[0-9]{1,3}(?:,[0-9]{3})+|[0-9]+)(?:\.[0-9]+)?)")
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")
Row = dict[str, str]


class DataPrepError(ValueError):
    """Bad source, malformed row, unwritable output: one line, no traceback."""


def build_prompt(question: str, style: str = "hash") -> str:
    if style not in PROMPT_STYLES:
        raise ValueError(f"unknown prompt style {style!r}; known: {', '.join(PROMPT_STYLES)}")
    return PROMPT_STYLES[style].format(question=question)


def ground_truth(answer: str) -> str:
    """The number after a solution's last ``####``, commas removed; ValueError when there is
    none, it is not a plain number, or the reward would credit no response with it."""
    _, marker, tail = answer.rpartition("####")
    if not marker:
        raise ValueError("answer has no '#### <number>' line")
    value = tail.strip()
    shown = value if len(value) <= 40 else value[:37] + "..."
    match = _NUMBER.fullmatch(value)
    if not match:
        raise ValueError(f"answer after '####' is not a number: {shown!r}")
    truth = (match[1] or "") + match[2].replace(",", "")
    long = len(value) > reward.ANSWER_WINDOW
    if long or not reward.compute_score(None, f"#### {value}", truth)["acc"]:
        raise ValueError(
            f"answer after '####' is a number no response can match: {shown!r} (the reward "
            f"reads {reward.ANSWER_WINDOW} characters of an answer line)"
        )
    return truth


def one_line(err: BaseException) -> str:
    text = " ".join(str(err).split()) or type(err).__name__
    return text if len(text) <= 200 else text[:197] + "..."


def _validate(raw: Any, where: str) -> Row:
    if not isinstance(raw, dict):
        raise DataPrepError(f"{where}: row is not a JSON object")
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
    try:
        ground_truth(raw["answer"])
    except ValueError as err:
        raise DataPrepError(f"{where}: {err}") from None
    return {"question": raw["question"], "answer": raw["answer"]}


def _read_jsonl(path: Path, limit: int | None) -> list[Row]:
    try:
        lines = path.read_bytes().split(b"\n")
    except OSError as err:
        raise DataPrepError(f"{path}: cannot read ({one_line(err)})") from None
    rows: list[Row] = []
    for number, line in enumerate(lines, start=1):
        if limit is not None and len(rows) >= limit:
            break
        where = f"{path}:{number}"
        try:
            text = line.decode("utf-8")
            raw = json.loads(text) if text.strip() else None  # blank lines carry no row
        except UnicodeDecodeError:
            raise DataPrepError(f"{where}: not UTF-8 text") from None
        except json.JSONDecodeError as err:
            raise DataPrepError(f"{where}: invalid JSON ({err.msg}, column {err.colno})") from None
        except RecursionError:
            raise DataPrepError(f"{where}: invalid JSON (nested too deep)") from None
        if raw is not None or text.strip():
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
        table = pq.read_table(path, columns=["question", "answer"]).slice(0, limit)
    except (pa.ArrowException, OSError) as err:
        raise DataPrepError(f"{path}: not a readable parquet file ({one_line(err)})") from None
    return [_validate(raw, f"{path}:row {i}") for i, raw in enumerate(table.to_pylist(), 1)]


def _load_dir(root: Path, limit: int | None, splits: Sequence[str]) -> dict[str, list[Row]]:
    out = {}
    for split in splits:
        files = [root / f"{split}.jsonl"] if (root / f"{split}.jsonl").is_file() else []
        for folder in (root / HUB_CONFIG, root):
            files = files or sorted(folder.glob(f"{split}-*-of-*.parquet"))
        if not files:
            raise DataPrepError(f"{root}: no {split}.jsonl, {HUB_CONFIG}/{split}-00000-of-00001"
                                f".parquet or {split}-00000-of-00001.parquet")  # fmt: skip
        rows: list[Row] = []
        for path in files:
            left = None if limit is None else limit - len(rows)
            if left != 0:
                reader = _read_jsonl if path.suffix == ".jsonl" else _read_parquet
                rows += reader(path, left)
        if not rows:
            raise DataPrepError(f"{files[0]}: no rows")
        out[split] = rows
    return out


def hub_unreachable(timeout: float = 3.0) -> str | None:
    """Why the hub ($HF_ENDPOINT) cannot be reached, or None (also behind a proxy, where a TCP
    probe proves nothing): an offline machine fails in seconds, not after the client's retries."""
    if any(os.environ.get(k) for k in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return None
    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname or "huggingface.co", port), timeout).close()
    except OSError as exc:
        return str(exc) or type(exc).__name__
    return None


def _load_hub(source: str, limit: int | None, splits: Sequence[str]) -> dict[str, list[Row]]:
    offline = os.environ.get("HF_HUB_OFFLINE", "0").lower() not in ("", "0", "false", "no", "off")
    if not offline and hub_unreachable() is not None:  # a local datasets cache still serves
        os.environ.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
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
    return {
        split: [_validate(raw, f"{source} ({HUB_CONFIG}, {split}):row {i}") for i, raw in
                enumerate(table.select(range(min(limit or len(table), len(table)))), 1)]
        for split, table in tables.items()
    }  # fmt: skip


def load_source(
    source: str, limit: int | None = None, splits: Sequence[str] = SPLITS
) -> dict[str, list[Row]]:
    """split -> validated rows ``{"question", "answer"}`` of a directory or a hub dataset id;
    ``limit``: the first N rows of each split. DataPrepError on the first bad row."""
    if limit is not None and limit < 1:
        raise DataPrepError(f"--limit must be at least 1, got {limit}")
    path = Path(source).expanduser()
    if path.exists():
        if not path.is_dir():
            raise DataPrepError(f"{path}: --source must be a directory or a hub dataset id")
        return _load_dir(path, limit, splits)
    if not _HUB_ID.fullmatch(source):
        raise DataPrepError(f"{path}: no such directory (nor a hub dataset id like {HUB_ID})")
    return _load_hub(source, limit, splits)


def parquet_writer(records: list[dict], schema: Any) -> Callable[[Path], None]:
    """A writer for ``replace_all``: the same records and schema give the same bytes."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist(records, schema=schema)
    return lambda path: pq.write_table(table, path, compression="snappy")


def schema(**columns: tuple[str, ...] | None) -> Any:
    """A parquet schema: each column a string, or a struct of the fields named (strings; an
    ``index`` is an int64); ``prompt`` and ``messages`` are chat turns."""
    import pyarrow as pa

    turns = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))
    kinds = {"index": pa.int64(), "messages": turns, "prompt": turns}

    def kind(name: str, fields: tuple[str, ...] | None = None) -> Any:
        if fields is not None:
            return pa.struct([(field, kind(field)) for field in fields])
        return kinds.get(name, pa.string())

    return pa.schema([(name, kind(name, fields)) for name, fields in columns.items()])


def verl_rows(
    rows: Sequence[Row], split: str, style: str = "hash", tools: str | None = None
) -> list[dict]:
    """RLHFDataset rows; index: the 0-based row in its split. With ``tools``: the tool's system
    turn, the question alone, ``agent_name`` tool_agent (else verl's single-turn loop runs the row
    and shows no tool)."""
    system = [{"role": "system", "content": TOOL_PROMPTS[tools]}] if tools else []
    return [{"data_source": DATA_SOURCE,
             "prompt": [*system, {"role": "user", "content": row["question"] if tools
                                  else build_prompt(row["question"], style)}],
             "ability": "math",
             "reward_model": {"style": "rule", "ground_truth": ground_truth(row["answer"])},
             "extra_info": {"split": split, "index": i, **row},
             **({"agent_name": "tool_agent"} if tools else {})}
            for i, row in enumerate(rows)]  # fmt: skip


def _hub_writers(splits: dict[str, list[Row]], hub: Path) -> Writers:
    files = "".join(f"  - split: {s}\n    path: {HUB_CONFIG}/{s}-00000-of-00001.parquet\n"
                    for s in splits)  # fmt: skip
    readme = (
        f"---\nconfigs:\n- config_name: {HUB_CONFIG}\n  data_files:\n{files}---\n\n"
        f"# GSM8K ({HUB_ID}, config {HUB_CONFIG}), local copy\n\n"
        "Written by `python -m data_prep.gsm8k --hub-layout-dir` in the hub's layout, so that\n"
        "tools which load the hub dataset (EvalScope, `datasets.load_dataset(DIR, 'main')`)\n"
        "read it offline. GSM8K is (c) OpenAI, released under the MIT licence.\n"
    ).encode()
    writers: Writers = {
        hub / HUB_CONFIG / f"{split}-00000-of-00001.parquet": parquet_writer(
            rows, schema(question=None, answer=None)
        )
        for split, rows in splits.items()
    }
    writers[hub / "README.md"] = lambda path: path.write_bytes(readme)
    return writers


def write_all(
    splits: dict[str, list[Row]], out_dir: Path, style: str = "hash", hub_dir: Path | None = None,
    tools: str | None = None,
) -> dict[str, Path]:  # fmt: skip
    """``<out_dir>/<split>.parquet`` and, with ``hub_dir``, the hub's layout there (its README's
    YAML header declares config ``main``, which EvalScope and ``datasets`` need offline), as ONE
    atomic step: every location checked and every file complete before the first rename."""
    out_dir = Path(out_dir).expanduser()
    verl = schema(data_source=None, prompt=None, ability=None,
                  reward_model=("style", "ground_truth"),
                  extra_info=("split", "index", "question", "answer"),
                  **({"agent_name": None} if tools else {}))  # fmt: skip
    writers = {
        out_dir / f"{split}.parquet": parquet_writer(verl_rows(rows, split, style, tools), verl)
        for split, rows in splits.items()
    }
    replace_all(writers | (_hub_writers(splits, Path(hub_dir).expanduser()) if hub_dir else {}))
    return {split: out_dir / f"{split}.parquet" for split in splits}


def write_hub_layout(splits: dict[str, list[Row]], out_dir: Path) -> Path:
    """Only the hub's layout of ``splits``, under ``out_dir``."""
    replace_all(_hub_writers(splits, Path(out_dir).expanduser()))
    return Path(out_dir).expanduser()


def positive_int(text: str) -> int:
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"not an integer of at least 1: {text!r}")
    return int(text)


def parser(prog: str, description: str, out_dir: str, style_help: str) -> argparse.ArgumentParser:
    """The flags data_prep.gsm8k and data_prep.sft share."""
    parser = argparse.ArgumentParser(prog=f"python -m {prog}", description=description)
    parser.add_argument("--source", default=HUB_ID, help=f"where GSM8K comes from: a hub dataset "
                        f"id (default {HUB_ID}, config {HUB_CONFIG}, needs network or a datasets "
                        "cache), or a directory holding OpenAI's train.jsonl/test.jsonl or the "
                        f"hub parquet layout ({HUB_CONFIG}/train-00000-of-00001.parquet, ... or "
                        "those files at its top level)")  # fmt: skip
    parser.add_argument("--out-dir", default=out_dir, help="directory for train.parquet and "
                        f"test.parquet (default {out_dir}; created if missing; existing files are "
                        "replaced atomically, and only when every row is valid)")  # fmt: skip
    parser.add_argument("--prompt-style", choices=list(PROMPT_STYLES), default="hash",
                        help=style_help)  # fmt: skip
    parser.add_argument(
        "--limit",
        type=positive_int,
        metavar="N",
        help="keep only the first N rows of each split (for quick runs)",
    )
    parser.add_argument("--splits", nargs="+", choices=SPLITS, default=list(SPLITS),
                        metavar="SPLIT", help="splits to prepare, of: train test (default: "
                        "both)")  # fmt: skip
    return parser


def run(prog: str, args: argparse.Namespace, write: Callable, noun: str) -> int:
    """Load and validate every row of ``args.source``, then ``write(rows)`` (split -> path);
    exit 0, or 2 after one line (bad input, a failed write), or 130 on Ctrl-C."""
    start = time.perf_counter()
    try:
        data = load_source(args.source, args.limit, list(dict.fromkeys(args.splits)))
        counts = ", ".join(f"{len(rows)} {split}" for split, rows in data.items())
        print(f"{prog}: read {counts} rows from {args.source}; writing...", flush=True)
        paths = write(data)
    except (DataPrepError, NotWritable) as err:
        print(f"{prog}: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # a full disk, a file vanishing under us
        print(f"{prog}: cannot write output: {one_line(err)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted; outputs are replaced all together or not at all",
              file=sys.stderr)  # fmt: skip
        return 130
    print(f"{prog}: source {args.source}, prompt style {args.prompt_style}")
    for split, path in paths.items():
        print(f"  {split}: {len(data[split])} {noun} -> {path}")
    print(f"{prog}: done in {time.perf_counter() - start:.2f} s")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    cli = parser("data_prep.gsm8k", "Prepare GSM8K as train.parquet/test.parquet rows for verl "
                 "0.9.1 (RLHFDataset schema). Every row is validated before anything is written.",
                 "~/data/gsm8k", "instruction appended to each question: 'hash' (default; "
                 "verl's 'Let's think step by step and output the final answer after \"####\".') "
                 "or 'boxed' (final answer within \\boxed{}, EvalScope's gsm8k "
                 "instruction)")  # fmt: skip
    cli.add_argument("--hub-layout-dir", metavar="DIR", help="also write the rows in the hub's "
                     f"layout ({HUB_CONFIG}/<split>-00000-of-00001.parquet + README.md) to DIR, "
                     "for offline EvalScope: --dataset-args "
                     "'{\"gsm8k\":{\"dataset_id\":\"DIR\"}}'")  # fmt: skip
    cli.add_argument("--tools", choices=list(TOOL_PROMPTS), help="rows for a tool recipe "
                     "(TOOLS=<name>): the tool's system turn, the question without the "
                     "instruction, agent_name tool_agent (docs/tools.md)")  # fmt: skip
    args = cli.parse_args(argv)
    write = partial(write_all, out_dir=args.out_dir, style=args.prompt_style,
                    hub_dir=args.hub_layout_dir, tools=args.tools)  # fmt: skip
    done = run("data_prep.gsm8k", args, write, "rows")
    if done == 0 and args.hub_layout_dir:
        print(f"  hub layout ({HUB_CONFIG}) -> {Path(args.hub_layout_dir).expanduser()}")
    return done


if __name__ == "__main__":
    sys.exit(main())
