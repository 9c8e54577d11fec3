"""Which attention a run uses, and why: flash-attn 2 where its extension loads, flash-attn 4 on
compute capability 9.0+ where it is installed, sdpa otherwise (verl_gsm8k/common/attention.py).

The capability is stood in for by a fake nvidia-smi (what the choice reads) and flash-attn-4 by a
package laid out as PyPI's wheel installs it (a ``flash_attn`` namespace with ``cute/``); its
kernels need a GPU, so what runs here is the decision, the overlay composed with verl's real
config, the launcher's refusal and the plugin's rewrite of the critic's hard-coded request.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import (
    ROOT,
    USER_KNOBS,
    composed_config,
    fake_nvidia_smi,
    plant_flash_attn,
    plant_flash_attn_4,
    recipe_env,
    run_recipe,
    with_pythonpath,
)

from verl_gsm8k.common import attention as att

H100 = ("NVIDIA H100 80GB HBM3", 81559)
A100 = ("NVIDIA A100-SXM4-80GB", 81920)
BROKEN = "flash_attn is installed but its CUDA extension flash_attn_2_cuda does not load (...)"


@pytest.mark.parametrize(
    ("want", "fa2", "caps", "installed", "name"),
    [
        ("auto", None, [(9, 0)], True, "fa2"),  # flash-attn 2 first, where it loads
        ("auto", BROKEN, [(9, 0)], True, "fa4"),
        ("auto", BROKEN, [(10, 0), (9, 0)], True, "fa4"),
        ("auto", BROKEN, [(9, 0), (8, 9)], True, "sdpa"),  # every GPU must be SM 9+
        ("auto", BROKEN, [(8, 0)], True, "sdpa"),
        ("auto", BROKEN, [(9, 0)], False, "sdpa"),
        ("auto", BROKEN, [], True, "sdpa"),
        ("auto", BROKEN, None, True, "sdpa"),
        ("fa4", None, [(9, 0)], True, "fa4"),  # asked for, beside a working flash-attn 2
        ("sdpa", None, [(9, 0)], True, "sdpa"),
        ("fa2", None, None, False, "fa2"),
    ],
)
def test_the_choice(want, fa2, caps, installed, name, monkeypatch):
    monkeypatch.setattr(att, "fa4_import_problem", lambda: None)  # a module that imports
    choice = att.choose(want, False, fa2, caps, installed)
    assert choice.name == name
    if name == "fa4" and want == "auto":
        assert choice.why == f"{BROKEN}; flash-attn-4 on compute capability {min(caps)[0]}.0"
    if name == "sdpa" and want == "auto":
        assert choice.why.startswith(f"{BROKEN}; flash-attn-4 ")


@pytest.mark.parametrize(
    ("want", "fa2", "caps", "installed", "refusal"),
    [
        ("fa4", BROKEN, [(8, 0)], True,
         "ATTENTION=fa4: flash-attn-4 needs compute capability 9.0+, this card has 8.0; "
         "use ATTENTION=auto or sdpa"),
        ("fa4", BROKEN, [(9, 0)], False,
         "ATTENTION=fa4: flash-attn-4 not installed on this 9.0 card (FLASH_ATTN=4 bash "
         "scripts/setup.sh installs it); use ATTENTION=auto or sdpa"),
        ("fa2", BROKEN, [(9, 0)], True, f"ATTENTION=fa2: {BROKEN}"),
        ("fa3", None, None, False, "ATTENTION=fa3 is not one of auto, fa2, fa4, sdpa"),
    ],
)  # fmt: skip
def test_a_request_the_machine_cannot_meet_is_refused(want, fa2, caps, installed, refusal):
    with pytest.raises(att.AttentionRefused) as refused:
        att.choose(want, False, fa2, caps, installed)
    assert str(refused.value) == refusal


def test_the_cpu_runs_sdpa():
    assert att.choose("auto", True, None, [(9, 0)], True) == att.Choice("sdpa", "trains on the CPU")
    with pytest.raises(att.AttentionRefused, match="the CPU runs sdpa only"):
        att.choose("fa4", True, None, [(9, 0)], True)


def test_the_statement_says_attention_padding_and_why():
    assert att.Choice("fa4", "x; y").line() == "flash_attention_4, padding removal on (x; y)"
    assert att.Choice("sdpa", "z").line() == (
        "sdpa, padding removal off (z: slower updates, more activation memory)"
    )


def test_the_capability_floor_is_transformers_own():
    from transformers.modeling_flash_attention_utils import FLASH_ATTENTION_COMPATIBILITY_MATRIX

    assert (
        FLASH_ATTENTION_COMPATIBILITY_MATRIX[4]["cuda_min_major_version"]
        == (att.FA4_MIN_CAPABILITY[0])
    )


def _forget_flash_attn() -> None:
    """The planted package leaves this process: later tests see the machine's own (none)."""
    for name in [m for m in sys.modules if m.split(".")[0] == "flash_attn"]:
        del sys.modules[name]
    importlib.invalidate_caches()


def test_the_probe_reads_nvidia_smi_and_the_installed_package(tmp_path: Path, monkeypatch, request):
    """probe() on this machine's facts: the capability from (a fake) nvidia-smi, flash-attn-4
    from its dist-info and its module; flash-attn 2's probe is not fooled by FA4's namespace."""
    site = plant_flash_attn_4(tmp_path / "site")
    monkeypatch.syspath_prepend(str(site))
    request.addfinalizer(_forget_flash_attn)  # monkeypatch restores sys.path itself
    importlib.invalidate_caches()
    for cap, name in (("9.0", "fa4"), ("8.6", "sdpa")):
        bin_dir = fake_nvidia_smi(tmp_path / f"bin{cap}", [H100], compute_cap=cap)
        monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
        choice = att.probe("auto")
        assert choice.name == name, choice
        assert choice.why.startswith("flash_attn 2 not installed (flash_attn holds flash-attn-4")


def test_the_overlays_say_what_the_choice_says():
    """configs/attention/<overlay>.yaml (and the SFT twin) set the implementation and the padding
    removal the choice states, for the actor (the reference loads from the same keys) and the
    critic."""
    for name, (implementation, padding, overlay) in att.PATHS.items():
        if overlay is None:
            continue
        ppo = yaml.safe_load((ROOT / "configs" / "attention" / f"{overlay}.yaml").read_text())
        sft = yaml.safe_load((ROOT / "configs" / "attention" / f"{overlay}_sft.yaml").read_text())
        for model in (ppo["actor_rollout_ref"]["model"], ppo["critic"]["model"], sft["model"]):
            assert model["override_config"]["attn_implementation"] == implementation, name
            assert model["use_remove_padding"] is padding, name


def test_the_plugin_gives_the_critic_flash_attention_4(tmp_path: Path):
    """verl 0.9.1 loads the critic with a hard-coded flash_attention_2: under the fa4 choice the
    plugin turns that request into flash_attention_4 in transformers' own resolution (which, on
    this CPU, then refuses FA4 for want of CUDA: the request it refuses is the rewritten one)."""
    site = plant_flash_attn_4(tmp_path / "site")
    env = {k: v for k, v in os.environ.items() if k not in USER_KNOBS}
    env["PATH"] = f"{fake_nvidia_smi(tmp_path / 'bin', [H100], '9.0')}:{env['PATH']}"
    code = (
        "import verl_gsm8k.verl_plugins.attention_fallback as p\n"
        "from transformers import PreTrainedModel, Qwen2Config, Qwen2ForCausalLM\n"
        "print(p.install(), p.current_choice().name, p.rewrite('flash_attention_2', "
        "p.current_choice()), p.rewrite('sdpa', p.current_choice()))\n"
        "cfg = Qwen2Config(hidden_size=16, intermediate_size=32, num_hidden_layers=1, "
        "num_attention_heads=2, num_key_value_heads=1, vocab_size=64)\n"
        "model = Qwen2ForCausalLM(cfg)\n"
        "try:\n"
        "    model._check_and_adjust_attn_implementation('flash_attention_2', is_init_check=True)\n"
        "except Exception as exc:\n"
        "    print('refused:', exc)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=with_pythonpath(env, site), capture_output=True,
        text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    first, *rest = out.stdout.splitlines()
    assert first == "True fa4 flash_attention_4 sdpa"
    assert rest[0].startswith("refused: FlashAttention4 has been toggled on"), rest


@pytest.mark.parametrize("card", ["H100", "A100"])
def test_the_launcher_chooses_fa4_on_sm90_and_refuses_it_below(
    card: str, tiny_model_dir, prepared_gsm8k_dir, tmp_path: Path
):
    """ATTENTION=fa4 DRY_RUN=1 of the PPO recipe (actor, reference, critic). On an SM 9.0 card:
    the fa4 overlay composes with verl's real config (the preflight's composition and
    validate_config, then verl's own `--cfg job`), and the launch line and the preflight's line
    are the same words. On an SM 8.0 card: one line, exit 2, before the preflight starts."""
    gpu, cap = {"H100": (H100, "9.0"), "A100": (A100, "8.0")}[card]
    env = recipe_env(tiny_model_dir, prepared_gsm8k_dir, tmp_path / "runs", DRY_RUN="1",
                     ATTENTION="fa4", TRAIN_BATCH_SIZE="16", PPO_MINI_BATCH_SIZE="8")  # fmt: skip
    env["PATH"] = f"{fake_nvidia_smi(tmp_path / 'bin', [gpu], cap)}:{env['PATH']}"
    env = with_pythonpath(env, plant_flash_attn_4(tmp_path / "site"))
    result = run_recipe("ppo_qwen2.5-0.5b_gsm8k", env, timeout=600)
    if card == "A100":
        assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
        assert result.stderr.strip().splitlines() == [
            "attention: ATTENTION=fa4: flash-attn-4 needs compute capability 9.0+, this card "
            "has 8.0; use ATTENTION=auto or sdpa"
        ]
        assert result.stdout == ""  # nothing started: no launch line, no preflight
        return
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    line = "flash_attention_4, padding removal on (flash_attn 2 not installed (flash_attn holds "
    line += "flash-attn-4 alone); flash-attn-4 on compute capability 9.0)"
    assert f"| attention: {line}" in result.stdout
    assert f"attention: {line}" in next(
        ln for ln in result.stdout.splitlines() if "[ok] device" in ln
    )
    job = composed_config(result.stdout)
    for model in (job["actor_rollout_ref"]["model"], job["critic"]["model"]):
        assert model["override_config"]["attn_implementation"] == "flash_attention_4"
        assert model["use_remove_padding"] is True
    # the actor (and the reference) read the model's key; `--cfg job` leaves it unresolved
    actor_padding = job["actor_rollout_ref"]["actor"]["use_remove_padding"]
    assert actor_padding == "${oc.select:actor_rollout_ref.model.use_remove_padding,false}"


def test_a_working_flash_attn_2_still_comes_first(tmp_path: Path):
    env = {k: v for k, v in os.environ.items() if k not in USER_KNOBS}
    env["PATH"] = f"{fake_nvidia_smi(tmp_path / 'bin', [H100], '9.0')}:{env['PATH']}"
    env = with_pythonpath(env, plant_flash_attn(tmp_path / "site", works=True))
    out = subprocess.run(
        [sys.executable, "-m", "verl_gsm8k.common.attention"], env=env, capture_output=True,
        text=True, timeout=120,
    )  # fmt: skip
    assert out.stdout.splitlines() == [
        "fa2",
        "flash_attention_2, padding removal on (flash-attn 2 loads)",
    ]
