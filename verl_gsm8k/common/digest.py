"""A file's sha256 by hashlib, read in blocks (a merged model's shards, a wheelhouse's files)."""

import hashlib
from pathlib import Path


def file_sha256(path: Path) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()
