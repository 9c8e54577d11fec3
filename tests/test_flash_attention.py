"""flash-attention is chosen only where its CUDA extension loads, and the launcher, the preflight
and the fallback plugin decide it the same way (one probe: verl_gsm8k/common/flash_attention.py).

A flash-attn wheel built for another torch or CUDA is found by find_spec and fails when verl's
workers load flash_attn_2_cuda ("undefined symbol"); it is planted here as a package whose
extension raises that ImportError, beside one whose extension loads and a machine without any.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers import UNDEFINED_SYMBOL, USER_KNOBS, plant_flash_attn, with_pythonpath

FALLBACK_MODULE = "verl_gsm8k.verl_plugins.attention_fallback"

# What the Python side decides, in one fresh interpreter: the probe's command line, the plugin
# verl loads in its workers, and the preflight's device line for a GPU config on packed sdpa (what
# the launcher's sdpa_packed overlay composes).
PYTHON_SIDE = textwrap.dedent(
    """
    import json, subprocess, sys
    from omegaconf import OmegaConf
    probe = subprocess.run([sys.executable, "-m", "verl_gsm8k.common.flash_attention"],
                           capture_output=True, text=True)
    import verl_gsm8k.verl_plugins.attention_fallback as fallback
    from verl_gsm8k.preflight.device import check_device
    from verl_gsm8k.preflight.lines import Report
    cfg = OmegaConf.create({
        "trainer": {"device": "cuda"},
        "actor_rollout_ref": {"model": {"use_remove_padding": True,
                                          "override_config": {"attn_implementation": "sdpa"}}},
    })
    report = Report()
    check_device(cfg, True, report)
    print(json.dumps({"probe_rc": probe.returncode, "probe_out": probe.stdout.strip(),
                      "plugin_active": fallback.install(), "device": report.lines[-1]}))
    """
)


def base_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in USER_KNOBS and k != "DEVICE"}
    env.update(PYTHON=sys.executable, VERL_USE_EXTERNAL_MODULES=FALLBACK_MODULE)
    return env


def python_side(env: dict[str, str]) -> dict:
    result = subprocess.run(
        [sys.executable, "-c", PYTHON_SIDE], env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def launcher_side(env: dict[str, str]) -> tuple[str, list[str], str]:
    """The launcher's plan in ``env`` (in a fresh process: flash_attn planted on its path): its
    attention line, overlays, plugin list."""
    code = (
        "import json, os; from verl_gsm8k.launch.plan import Recipe, make_plan; "
        "plan = make_plan(Recipe('probe', 'gsm8k_ppo'), os.environ); "
        "print(json.dumps([plan.attention_line, plan.device_overrides, "
        "plan.exports['VERL_USE_EXTERNAL_MODULES']]))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], env=dict(env, VERL_USE_EXTERNAL_MODULES=""),
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    attention, overlays, modules = json.loads(result.stdout.strip().splitlines()[-1])
    return attention, overlays, modules


@pytest.mark.parametrize("case", ["broken", "working", "absent"])
def test_launcher_preflight_and_plugin_agree(case: str, tmp_path: Path):
    env = base_env()
    if case != "absent":
        plant_flash_attn(tmp_path / "site", works=case == "working")
    env = with_pythonpath(env, tmp_path / "site")
    assert case != "absent" or __import__("importlib").util.find_spec("flash_attn") is None
    py = python_side(env)
    attention, overlays, modules = launcher_side(env)
    sdpa = "+attention=sdpa_packed" in overlays  # a GPU without flash-attn 2: packed sdpa
    # one decision, three places
    assert sdpa == (py["probe_rc"] == 1) == py["plugin_active"] == (FALLBACK_MODULE in modules)
    if case == "working":
        assert not sdpa and py["probe_out"] == ""
        assert attention == "flash_attention_2, padding removal on (flash-attn 2 loads)"
        # the preflight's config asks for sdpa here: it says so, and what auto would choose
        assert (
            "attention: sdpa, padding removal on (set by the overrides; ATTENTION=auto chooses "
            "fa2 here: flash-attn 2 loads)" in py["device"]
        )
        return
    assert sdpa
    why = (
        "flash_attn not installed"
        if case == "absent"
        else "flash_attn is installed but its CUDA extension flash_attn_2_cuda does not load "
        f"(ImportError: {UNDEFINED_SYMBOL})"
    )
    assert py["probe_out"] == why
    # the launch prints it, and the preflight's line is the same words
    assert (
        attention
        == f"sdpa, padding removal on ({why}; packed rows, block-diagonal mask from position_ids)"
    )
    assert py["device"].endswith(f"attention: {attention}")
