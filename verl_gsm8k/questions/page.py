"""questions.html, its data files (data/table.js, data/col<i>.js) and summary.json."""

import json
from pathlib import Path

from verl_gsm8k.common.atomic_io import write_atomic
from verl_gsm8k.svgplot.page import data_js, page

from .table import Column

CODE = (Path(__file__).parent / "questions.js").read_text(encoding="utf-8")


def write(columns: list[Column], table: dict, out: Path) -> Path:
    ids = {(r["question"], r["ground_truth"]): r["id"] for r in table["rows"]}
    table["sampled"] = any(len(cell.responses) > 1 for c in columns for cell in c.cells.values())
    names = ["data/table.js", *(f"data/col{i}.js" for i in range(len(columns)))]
    write_atomic(out / names[0], data_js("QDATA", "table", table))
    for i, column in enumerate(columns):
        cells = {ids[k]: cell.responses for k, cell in column.cells.items() if k in ids}
        write_atomic(out / names[i + 1], data_js("QDATA", i, cells))
    options = "".join(f'<option value="{f}">{f.replace("_", " ")}</option>'
                      for f in ("all", *table["counts"]))  # fmt: skip
    body = f"""<h1>Which questions changed</h1><div id="counts"></div>
<p><select id="filter">{options}</select> <select id="sort">
<option value="order">dataset order</option><option value="change">change (last - first)</option>
<option value="length">response length</option></select>
<input id="search" placeholder="search questions"> <span id="shown"></span></p>
<table><thead><tr id="head"></tr></thead><tbody id="rows"></tbody></table>"""
    write_atomic(out / "summary.json", json.dumps(table, indent=1) + "\n")
    write_atomic(out / "questions.html", page("Which questions changed", [body], "", names, CODE))
    return out / "questions.html"
