"""What the replay page and the rollout browser share: their style, how a page loads one step's
data file from beside it (a ``<script src>``, which works from ``file://`` where ``fetch`` does
not), and how a data file is written."""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from verl_gsm8k.common.atomic_io import write_atomic

ASSETS = Path(__file__).resolve().parent


def script(name: str) -> str:
    """A script of this package (``common.js``, ``replay.js``, ``rollouts.js``), as text."""
    return (ASSETS / name).read_text()


def data_js(variable: str, key: Any, payload: Any) -> str:
    """A data file: ``window.VARIABLE[key] = {...};`` (JSON, no NaN)."""
    body = json.dumps(payload, separators=(",", ":"), allow_nan=False)
    slot = f"window.{variable}"
    return f"{slot}={slot}||{{}};{slot}[{json.dumps(key)}]={body};\n"


def write_data(folder: Path, name: str, text: str) -> None:
    write_atomic(folder / name, text)


def page(title: str, body: str, code: str, head_scripts: list[str]) -> str:
    """A whole page: the shared style and loader, ``head_scripts`` (data files beside it), then
    ``body`` and the page's own ``code``."""
    tags = "".join(f'<script src="{html.escape(src)}"></script>' for src in head_scripts)
    return (
        "<!DOCTYPE html><html lang=en><head><meta charset=utf-8>"
        f"<title>{html.escape(title)}</title><style>{script('page.css')}</style>{tags}"
        f"<script>{script('common.js')}</script></head><body>{body}<script>{code}</script>"
        "</body></html>\n"
    )
