"""Benchmark, not a test: the questions page at GSM8K scale (1319 questions x 20 steps) in Chromium.

    python -m verl_gsm8k.bench.questions [--questions 1319] [--steps 20] [--out DIR]

Writes synthetic validation dumps (each question right or wrong at random per step, a ~300-char
response each), builds the page with verl_gsm8k.questions, then opens it in headless Chromium
(/usr/bin/chromium --dump-dom) three times: unfiltered, #filter=flipping&sort=change and
#q=<a word>. Prints the build time, the page's own render time (data-render-ms: the table built
after the data files loaded) and the whole Chromium wall time of each open.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import subprocess
import tempfile
import time
from pathlib import Path

from verl_gsm8k.common.run_dir import VALIDATION_DIR
from verl_gsm8k.questions.__main__ import main as questions_main

CHROMIUM = "/usr/bin/chromium"
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)


def write_dumps(folder: Path, questions: int, steps: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    skill = [rng.random() for _ in range(questions)]
    for step in range(steps):
        lines = []
        for q in range(questions):
            truth = str(q % 97 + 3)
            right = rng.random() < min(1.0, skill[q] + step / (2 * steps))
            answer = truth if right else str(int(truth) + 1)
            output = f"Step {step}: item {q} has some apples. " * 8 + f"\n#### {answer}"
            prompt = f"system\nsys\nuser\nQuestion {q}: how many apples in case {q}?\nassistant\n"
            row = {"input": prompt, "output": output, "gts": truth, "acc": float(right)}
            lines.append(json.dumps(row))
        (folder / f"{step * 10}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")


def open_page(page: Path, fragment: str) -> tuple[float, str]:
    with tempfile.TemporaryDirectory() as profile:
        start = time.perf_counter()
        done = subprocess.run(
            [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "--dump-dom",
             page.resolve().as_uri() + fragment],
            capture_output=True, text=True, timeout=300, check=True,
        )  # fmt: skip
        wall = time.perf_counter() - start
    found = re.search(r'data-render-ms="([0-9.]+)"', done.stdout)
    return wall, found.group(1) if found else "?"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m verl_gsm8k.bench.questions", description=__doc__
    )
    parser.add_argument("--questions", type=int, default=1319, help="questions per step")
    parser.add_argument("--steps", type=int, default=20, help="validation steps (columns)")
    parser.add_argument("--out", type=Path, default=None, help="work folder (default: a temp)")
    args = parser.parse_args(argv)
    work = args.out or Path(tempfile.mkdtemp(prefix="questions-bench-"))
    run = work / "run"
    (run / VALIDATION_DIR).mkdir(parents=True, exist_ok=True)
    write_dumps(run / VALIDATION_DIR, args.questions, args.steps)
    start = time.perf_counter()
    assert questions_main(["--run", str(run), "--out", str(work / "page")]) == 0
    print(f"build: {time.perf_counter() - start:.2f} s")
    page = work / "page" / "questions.html"
    for fragment in ("", "#filter=flipping&sort=change", "#q=case%2012"):
        wall, render_ms = open_page(page, fragment)
        print(f"open {fragment or '(all)'}: render {render_ms} ms, chromium wall {wall:.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
