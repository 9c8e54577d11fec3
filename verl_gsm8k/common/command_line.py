"""The command a launch gives verl as one shell line; a name like a key, token, secret or password
shows ***."""

import re
import shlex
from collections.abc import Mapping, Sequence

PREFIX = "recipe: verl command: "
MASK = "***"
_SECRET = re.compile(r"(?i)(key|token|secret|password)")
_ASSIGNMENT = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=(.*)", re.S)


def _shown(arg: str) -> str:
    key, sep, _ = arg.partition("=")
    return f"{key}={MASK}" if sep and _SECRET.search(key.rsplit(".", 1)[-1]) else arg


def shell_line(argv: Sequence[str], env: Mapping[str, str]) -> str:
    """``NAME=value ... python -m MODULE args...``, quoted for a POSIX shell."""
    words = [f"{name}={shlex.quote(MASK if _SECRET.search(name) else value)}"
             for name, value in env.items()]  # fmt: skip
    return " ".join([*words, *(shlex.quote(_shown(arg)) for arg in argv)])


def split_line(line: str) -> tuple[dict[str, str], list[str]]:
    """``shell_line``'s line read back: (the variables, the words); ValueError if not a line."""
    words = shlex.split(line)
    env: dict[str, str] = {}
    while words and (match := _ASSIGNMENT.fullmatch(words[0])):
        env[match.group(1)] = match.group(2)
        words = words[1:]
    return env, words
