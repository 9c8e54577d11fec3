"""The wheelhouse's manifest: each file of DIR matched to the lock entry whose hashes hold its
sha256 (a file beside the lock, pip's own wheel for the offline set-up, is named by its file
name), written as MANIFEST.tsv (tab-separated: name, version, file, sha256, bytes). ``check``
names in one line an entry of the lock that no file holds, before an offline install, so a
missing wheel is named instead of an installer's resolution error.

    python -m verl_gsm8k.wheelhouse manifest --lock locks/eval.txt --dir DIR
    python -m verl_gsm8k.wheelhouse check --lock locks/eval.txt --dir DIR
"""

from __future__ import annotations

import argparse
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


@dataclass(frozen=True)
class Entry:
    name: str
    version: str
    hashes: frozenset[str]


def entries(lock_text: str) -> list[Entry]:
    return [
        Entry(name, version, frozenset(HASH.findall(block)))
        for name, version, block in ENTRY.findall(lock_text)
    ]


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_file() and p.name != MANIFEST)


def write_manifest(lock: Path, folder: Path) -> tuple[int, int, list[str]]:
    """MANIFEST.tsv of ``folder`` against ``lock``: (files, bytes, the lock's entries with no
    file)."""
    by_hash = {h: e for e in entries(lock.read_text()) for h in e.hashes}
    rows, found, total = [], set(), 0
    for path in _files(folder):
        digest, size = file_sha256(path), path.stat().st_size
        entry = by_hash.get(digest)
        if entry is not None:
            found.add(entry.name)
        # a file beside the lock (pip's wheel): named by its file, name-version-...
        name, version = (entry.name, entry.version) if entry else tuple(path.name.split("-")[:2])
        rows.append(f"{name}\t{version}\t{path.name}\t{digest}\t{size}")
        total += size
    tmp = folder / f".{MANIFEST}.tmp"
    tmp.write_text("name\tversion\tfile\tsha256\tbytes\n" + "".join(r + "\n" for r in rows))
    os.replace(tmp, folder / MANIFEST)
    missing = [f"{e.name}=={e.version}" for e in entries(lock.read_text()) if e.name not in found]
    return len(rows), total, missing


def missing_files(lock: Path, folder: Path) -> list[str]:
    """The lock's entries that no file of ``folder`` holds, by its sha256 as the manifest says
    it (the installer checks the hashes again as it installs)."""
    manifest = folder / MANIFEST
    if not manifest.is_file():
        return [f"{folder} has no {MANIFEST} (make wheelhouse writes it)"]
    held = set()
    for line in manifest.read_text().splitlines()[1:]:
        fields = line.split("\t")
        if len(fields) == 5 and (folder / fields[2]).is_file():
            held.add(fields[3])
    return [f"{e.name}=={e.version}" for e in entries(lock.read_text()) if not e.hashes & held]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m verl_gsm8k.wheelhouse", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("action", choices=("manifest", "check"),
                        help="manifest: write DIR/MANIFEST.tsv and print the total; check: exit 1 "
                        "naming the first entry of LOCK without a file in DIR")  # fmt: skip
    parser.add_argument("--lock", type=Path, required=True, help="the lock (locks/<name>.txt)")
    parser.add_argument("--dir", type=Path, required=True, help="the wheelhouse folder")
    args = parser.parse_args(argv)
    if not args.dir.is_dir():
        print(f"wheelhouse: {args.dir} is not a folder", file=sys.stderr)
        return 1
    if args.action == "manifest":
        files, total, missing = write_manifest(args.lock, args.dir)
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
