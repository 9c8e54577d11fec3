"""questions.html + data/col<i>.js (one per column) + summary.json, each written atomically."""

from __future__ import annotations

import html
import json
from pathlib import Path

from verl_gsm8k.common.atomic_io import write_atomic

from .table import Column

_HERE = Path(__file__).parent  # questions.js and questions.css, inlined into the page


def write(columns: list[Column], table: dict, out: Path) -> Path:
    """Write the page under ``out``; returns questions.html's path."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "data").mkdir(exist_ok=True)
    ids = {(r["question"], r["ground_truth"]): r["id"] for r in table["rows"]}
    table["sampled"] = any(len(cell.responses) > 1 for c in columns for cell in c.cells.values())
    scripts = []
    for i, column in enumerate(columns):
        data = {ids[k]: cell.responses for k, cell in column.cells.items() if k in ids}
        name = f"data/col{i}.js"
        body = json.dumps(data).replace("</", "<\\/")
        write_atomic(out / name, f"(window.QCOLS=window.QCOLS||[])[{i}]={body};\n")
        scripts.append(name)
    write_atomic(
        out / "data/table.js", "window.QTABLE=" + json.dumps(table).replace("</", "<\\/") + ";\n"
    )
    options = "".join(
        f'<option value="{f}">{html.escape(f.replace("_", " "))}</option>'
        for f in ("all", *table["counts"])
    )
    tags = "".join(f'<script src="{s}"></script>' for s in ["data/table.js", *scripts])
    css = (_HERE / "questions.css").read_text(encoding="utf-8")
    js = (_HERE / "questions.js").read_text(encoding="utf-8")
    page = f"""<!doctype html><html><head><meta charset="utf-8">
<title>Which questions changed</title><style>{css}</style></head>
<body><h1>Which questions changed</h1><div id="counts"></div>
<p><select id="filter">{options}</select> <select id="sort">
<option value="order">dataset order</option>
<option value="change">change (last - first)</option>
<option value="length">response length</option></select>
<input id="search" placeholder="search questions"> <span id="shown"></span></p>
<table><thead><tr id="head"></tr></thead><tbody id="rows"></tbody></table>
{tags}<script>{js}</script></body></html>
"""
    write_atomic(out / "summary.json", json.dumps(table, indent=1) + "\n")
    write_atomic(out / "questions.html", page)
    return out / "questions.html"
