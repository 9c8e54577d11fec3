"""JSON this process did not write, read with bounds: too large, too deep or not JSON is one
``JsonError`` naming where."""

import json
import os
from typing import Any

MAX_FILE_BYTES = 64 << 20
MAX_LINE_CHARS = 16 << 20


class JsonError(ValueError):
    def __init__(self, where: str, reason: str) -> None:
        super().__init__(f"{where}: not readable JSON ({reason})")
        self.where, self.reason = where, reason


def parse(text: str | bytes, where: str, max_chars: int = MAX_LINE_CHARS) -> Any:
    if len(text) > max_chars:
        raise JsonError(where, f"{len(text)} characters, more than the {max_chars} read")
    try:
        return json.loads(text)
    except RecursionError:
        raise JsonError(where, "nested too deep") from None
    except json.JSONDecodeError as err:
        raise JsonError(where, f"{err.msg}, column {err.colno}") from None
    except (ValueError, TypeError) as err:  # bytes that are not UTF-8
        raise JsonError(where, str(err)) from None


def read(path: str | os.PathLike[str], max_bytes: int = MAX_FILE_BYTES) -> Any:
    with open(path, "rb") as handle:
        data = handle.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise JsonError(str(path), f"more than {max_bytes} bytes, too large to be this file")
    try:
        return parse(data.decode("utf-8"), str(path), max_chars=max_bytes)
    except UnicodeDecodeError as err:
        raise JsonError(str(path), f"not UTF-8: {err}") from None
