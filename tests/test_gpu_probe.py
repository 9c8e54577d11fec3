"""The GPU probe (bench/gpu_probe.py) on the CPU at the tiny model's shape."""

import json
import re
import sys

import pytest
from helpers import ROOT, capture

from verl_gsm8k.bench import gpu_probe
from verl_gsm8k.preflight import memory as mem

TINY = ["--models", "tiny", "--tokens", "256", "--seq", "64", "--device", "cpu"]


def run_probe(out) -> tuple[dict, str]:
    assert gpu_probe.main([*TINY, "--out", str(out)]) == 0
    return json.loads((out / "gpu_probe.json").read_text()), (out / "gpu_probe.md").read_text()


def test_every_phase_is_measured_beside_the_preflights_estimate(tmp_path, monkeypatch):
    table, text = run_probe(tmp_path / "a")
    rows = {row["phase"]: row for row in table["rows"]}
    assert list(rows) == list(gpu_probe.PHASES) and table["device"].startswith("CPU")
    for row in rows.values():
        assert row["status"] == "ok" and row["measured_mib"] > 0 and row["warm_seconds"] > 0, row
    padded = {row["tokens"] for row in rows.values() if "padded" in row["phase"]}
    assert {r["tokens"] for r in rows.values() if "packed" in r["phase"]} == {256}
    assert len(padded) == 1 and padded.pop() > 256  # the padding was computed
    assert len(re.findall(r"\| \d+\.\d \| \d+\.\d \| \d+\.\d\d \| ok \|", text)) == len(rows)
    c = gpu_probe.tiny_config()
    expected = mem.logprob_pass(c, 256, 2, entropy=True, rmpad=True, compiled=True) / 2**20
    assert rows["old log-prob, packed, compiled entropy"]["estimate_mib"] == pytest.approx(expected)
    original = mem.logprob_pass  # the column is the preflight's answer, not a copy of it
    monkeypatch.setattr(mem, "logprob_pass", lambda *a, **k: 2 * original(*a, **k))
    doubled = {row["phase"]: row for row in run_probe(tmp_path / "b")[0]["rows"]}
    for phase in gpu_probe.PHASES[:5]:
        assert doubled[phase]["estimate_mib"] == pytest.approx(2 * rows[phase]["estimate_mib"])


def test_defaults_are_the_recipes_budgets():
    from verl_gsm8k.launch.knobs import BY_NAME

    budgets = re.findall(
        r"max_token_len_per_gpu: (\d+)", (ROOT / "configs/gsm8k_base.yaml").read_text()
    )
    assert budgets and set(budgets) == {str(gpu_probe.RECIPE_TOKENS)}
    seq = sum(int(BY_NAME[k].default) for k in ("MAX_PROMPT_LENGTH", "MAX_RESPONSE_LENGTH"))
    assert seq == gpu_probe.RECIPE_SEQ
    lengths = gpu_probe.row_lengths(16384, 768)
    assert sum(lengths) == 16384 and min(lengths[:-1]) >= 384 and max(lengths) <= 768


def test_loads_without_verl_or_vllm_and_refuses_a_bad_size_in_one_line(tmp_path, capsys):
    code = ("import sys\nfor name in ('verl', 'vllm', 'ray', 'omegaconf', 'hydra'): "
            "sys.modules[name] = None\nimport verl_gsm8k.bench.gpu_probe\n")  # fmt: skip
    capture([sys.executable, "-c", code], 0, 120, cwd=ROOT)
    with pytest.raises(SystemExit) as exit_:
        gpu_probe.main(["--models", "2B", "--out", str(tmp_path)])
    assert exit_.value.code == 2 and "unknown Qwen2.5 size '2B'" in capsys.readouterr().err
