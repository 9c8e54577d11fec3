"""What every offline page shares: stylesheet, page, tables, and data files loaded by
``<script src>`` (works from file://). Text is escaped unless ``Raw``."""

import json
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from html import escape
from typing import Any

CSS = """
body{font-family:system-ui,sans-serif;margin:20px;color:#222;max-width:1400px}
h1{font-size:1.35em;margin:0 0 4px} h2{font-size:1.1em;margin:24px 0 6px}
.meta,.why{color:#666;font-size:.9em}
.cards,.grid,nav{display:flex;flex-wrap:wrap;gap:12px;margin:10px 0}
.card{border:1px solid #ddd;border-radius:6px;padding:8px 12px;min-width:150px}
.card b{display:block;font-size:1.25em} figure.chart{margin:0}
figure.chart figcaption{font-weight:600;font-size:.95em;margin:0 0 4px}
svg.plot{display:block;border:1px solid #e4e4e4;background:#fafafa;font-size:11px}
.plot.missing{width:640px;height:80px;border:1px dashed #ccc;padding:10px;color:#777;
box-sizing:border-box}
table{border-collapse:collapse;font-size:.92em} td,th{border:1px solid #ddd;padding:3px 7px;
text-align:left;vertical-align:top} th{background:#f4f4f4}
.sev-error,.bad{color:#b00;font-weight:bold} .sev-warning{color:#c60;font-weight:bold}
.sev-note,.note{color:#1f5fa0} .ok{color:#2a7a2a;font-weight:bold} .absent{color:#a33}
code,pre,.toks{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:.92em}
code{background:#f4f4f4;padding:0 3px}
pre{white-space:pre-wrap;background:#f7f7f7;padding:6px;margin:4px 0}
nav{align-items:center;position:sticky;top:0;background:#fff;padding:6px 0;z-index:2}
.toks{line-height:2.1} .tok{padding:2px 1px;border:1px solid #ccc;margin:0 1px;white-space:pre}
.tok:focus,.tok.on{outline:2px solid #111} .tok.answer{border:2px solid #7a3fb0} .ws{color:#999}
.tok.noloss{color:#777;border-style:dashed}
.legend span{display:inline-block;width:22px;height:12px;vertical-align:middle}
svg.curve{display:block;border:1px solid #e4e4e4;background:#fafafa;margin:4px 0}
#panel{position:sticky;bottom:0;background:#fffbe6;border:1px solid #e6d9a6;padding:6px 10px}
.pill{border-radius:9px;padding:0 7px;font-size:.82em;background:#eee;margin-right:3px}
.right{background:#cfc} .wrong{background:#fcc} .none{background:#eee} .part{background:#ffc}
.row{cursor:pointer} .cols{display:flex;gap:8px} .cols>div{flex:1;min-width:0}
mark{background:#fd8} #counts span{margin-right:1em} td.q{min-width:24em}
"""


def generated_at() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Raw(str):
    """Markup kept as it is where text would be escaped."""


def text(value: Any) -> str:
    return value if isinstance(value, Raw) else escape(str(value))


def table(head: Sequence[Any], rows: Iterable[Sequence[Any]], attrs: str = "",
          row_attrs: str = "") -> Raw:  # fmt: skip
    cells = ["<tr>" + "".join(f"<th>{text(h)}</th>" for h in head) + "</tr>"]
    cells += [f"<tr{row_attrs}>" + "".join(f"<td>{text(c)}</td>" for c in row) + "</tr>"
              for row in rows]  # fmt: skip
    return Raw(f"<table{attrs}>" + "\n".join(cells) + "</table>")


def page(title: str, body: Iterable[str], style: str = "", scripts: Sequence[str] = (),
         code: str = "", refresh: int | None = None) -> str:  # fmt: skip
    """A page: the stylesheet and ``style``, the ``scripts``, the ``body``, then ``code``."""
    head = f'<meta http-equiv="refresh" content="{refresh}">' if refresh else ""
    head += "".join(f'<script src="{escape(src)}"></script>' for src in scripts)
    code = f"<script>{code}</script>" if code else ""
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">{head}<title>'
            f"{escape(title)}</title><style>{CSS}{style}</style></head><body>\n"
            + "\n".join(part for part in body if part) + f"\n{code}</body></html>\n")  # fmt: skip


def data_js(variable: str, key: Any, payload: Any) -> str:
    """A data file: ``window.VARIABLE[key] = payload`` (strict JSON: no NaN)."""
    body = json.dumps(payload, separators=(",", ":"), allow_nan=False)
    slot = f"window.{variable}"
    return f"{slot}={slot}||{{}};{slot}[{json.dumps(key)}]={body};\n"
