"""The exact command a launch gives verl as one shell line: the launcher's variables, then verl's
entry point with every override in verl's order (split_line reads it back). A name like a key,
token, secret or password shows ***."""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence

PREFIX = "recipe: verl command: "  # how the line starts on the console
MASK = "***"
_SECRET = re.compile(r"(?i)(key|token|secret|password)")
_ASSIGNMENT = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=(.*)", re.S)


def _shown(arg: str) -> str:
    key, sep, _ = arg.partition("=")
    return f"{key}={MASK}" if sep and _SECRET.search(key.rsplit(".", 1)[-1]) else arg


def shell_line(argv: Sequence[str], env: Mapping[str, str]) -> str:
    """``NAME=value ... python -m MODULE args...``, every word quoted for a POSIX shell."""
    words = [f"{name}={shlex.quote(MASK if _SECRET.search(name) else value)}"
             for name, value in env.items()]  # fmt: skip
    return " ".join([*words, *(shlex.quote(_shown(arg)) for arg in argv)])


def split_line(line: str) -> tuple[dict[str, str], list[str]]:
    """``shell_line``'s line read back: (the variables, the command's words); ValueError when it
    does not parse as a shell line."""
    words = shlex.split(line)
    env: dict[str, str] = {}
    while words and (match := _ASSIGNMENT.fullmatch(words[0])):
        env[match.group(1)] = match.group(2)
        words = words[1:]
    return env, words
