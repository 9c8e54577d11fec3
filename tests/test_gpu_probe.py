"""The GPU probe (verl_gsm8k/bench/gpu_probe.py) on the CPU, on the tiny model's shape and a few
hundred tokens: its table has every phase with a positive measured peak (torch's tensor tracker
here; the allocator's on a GPU), its estimates are the preflight's functions' answers (patching
one of them moves the column), its defaults are the recipes' budgets, and it loads without verl
or vLLM (a GPU box needs torch and transformers only)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from helpers import ROOT

from verl_gsm8k.bench import gpu_probe
from verl_gsm8k.preflight import activations as act
from verl_gsm8k.preflight.memory import GIB

TINY = ["--models", "tiny", "--tokens", "256", "--seq", "64", "--device", "cpu"]


def run_probe(tmp_path, *extra: str) -> tuple[dict, str]:
    out = tmp_path / "probe"
    assert gpu_probe.main([*TINY, "--out", str(out), *extra]) == 0
    return json.loads((out / "gpu_probe.json").read_text()), (out / "gpu_probe.md").read_text()


@pytest.fixture(scope="module")
def probed(tmp_path_factory) -> tuple[dict, str]:
    return run_probe(tmp_path_factory.mktemp("gpu_probe"))


def test_every_phase_is_measured_beside_its_estimate(probed):
    table, text = probed
    rows = table["rows"]
    assert [row["phase"] for row in rows] == list(gpu_probe.PHASES)
    for row in rows:
        assert row["status"] == "ok", row
        assert row["measured_mib"] > 0 and row["estimate_mib"] > 0, row
        assert row["tokens"] > 0
        assert row["warm_seconds"] > 0, row  # each phase run again, timed
    padded = {row["tokens"] for row in rows if "padded" in row["phase"]}
    packed = {row["tokens"] for row in rows if "packed" in row["phase"]}
    assert packed == {256} and len(padded) == 1 and padded.pop() > 256  # padding was computed
    assert table["device"].startswith("CPU") and table["tokens"] == 256
    assert table["attn"] == "sdpa" and "attention sdpa" in text  # the recipes' path by default
    lines = [ln for ln in text.splitlines() if ln.startswith("| tiny |")]
    assert len(lines) == len(gpu_probe.PHASES)
    assert all(re.search(r"\| \d+\.\d \| \d+\.\d \| \d+\.\d\d \| ok \|", ln) for ln in lines)


def test_estimates_are_the_preflights_own(probed, tmp_path, monkeypatch):
    """The estimate column is what activations.py answers for the same shapes, and follows it
    when it changes (not a copy of its formulas)."""
    table, _ = probed
    hf = gpu_probe.tiny_config()
    by_phase = {row["phase"]: row for row in table["rows"]}
    padded = by_phase["reference, padded"]["tokens"]
    expected = act.logprob_pass(hf, padded, 2, entropy=False, rmpad=False) / 2**20
    assert by_phase["reference, padded"]["estimate_mib"] == pytest.approx(expected)
    expected = act.logprob_pass(hf, 256, 2, entropy=True, rmpad=True, compiled=True) / 2**20
    assert by_phase["old log-prob, packed, compiled entropy"]["estimate_mib"] == pytest.approx(
        expected
    )
    # the packed update under sdpa: torch's log-probs (4 + 3 x 2 bytes a logit), no flash-attn CE
    acts = act.update_pass(hf, 256, 2, True, rmpad=True, flash_ce=False)
    assert by_phase["actor update fwd+bwd, packed"]["estimate_mib"] * 2**20 >= acts - 1
    original = act.logprob_pass
    monkeypatch.setattr(act, "logprob_pass", lambda *a, **k: 2 * original(*a, **k))
    doubled = {row["phase"]: row for row in run_probe(tmp_path)[0]["rows"]}
    for phase in gpu_probe.PHASES[:5]:
        assert doubled[phase]["estimate_mib"] == pytest.approx(2 * by_phase[phase]["estimate_mib"])
    assert GIB == 2**30


def test_defaults_are_the_recipes_budgets():
    base = (ROOT / "configs" / "gsm8k_base.yaml").read_text()
    budgets = re.findall(r"(?:max_token_len_per_gpu): (\d+)", base)
    assert budgets and set(budgets) == {str(gpu_probe.RECIPE_TOKENS)}
    from verl_gsm8k.launch.knobs import BY_NAME

    prompt = int(BY_NAME["MAX_PROMPT_LENGTH"].default)
    response = int(BY_NAME["MAX_RESPONSE_LENGTH"].default)
    assert prompt + response == gpu_probe.RECIPE_SEQ


def test_rows_spread_like_gsm8k_and_sum_to_the_budget():
    lengths = gpu_probe.row_lengths(16384, 768)
    assert sum(lengths) == 16384
    assert all(1 <= n <= 768 for n in lengths) and min(lengths[:-1]) >= 384


def test_loads_without_verl_or_vllm():
    code = (
        "import sys\n"
        "for name in ('verl', 'vllm', 'ray', 'omegaconf', 'hydra'): sys.modules[name] = None\n"
        "import verl_gsm8k.bench.gpu_probe\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]


def test_bad_model_name_is_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        gpu_probe.main(["--models", "2B", "--out", str(tmp_path)])
    assert exit_.value.code == 2
    assert "unknown Qwen2.5 size '2B'" in capsys.readouterr().err
