"""Which attention a run uses, and why: flash-attn 2 where its extension loads, else sdpa with
padding removal on a GPU (sdpa_packed) and sdpa padded on the CPU; flash-attn 4 only when
ATTENTION=fa4 asks, on compute capability 9.0+ where it is installed
(verl_gsm8k/common/attention.py).

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
    gpu_recipe_overrides,
    plant_flash_attn,
    plant_flash_attn_4,
    recipe_env,
    run_recipe,
    with_pythonpath,
)

from verl_gsm8k.common import attention as att
from verl_gsm8k.common import gpus

H100 = ("NVIDIA H100 80GB HBM3", 81559)
A100 = ("NVIDIA A100-SXM4-80GB", 81920)
BROKEN = "flash_attn is installed but its CUDA extension flash_attn_2_cuda does not load (...)"


@pytest.mark.parametrize(
    ("want", "fa2", "caps", "installed", "name"),
    [
        ("auto", None, [(9, 0)], True, "fa2"),  # flash-attn 2 first, where it loads
        # without it, packed sdpa on every GPU: flash-attn 4 installed on SM 9+ is not taken
        ("auto", BROKEN, [(9, 0)], True, "sdpa_packed"),
        ("auto", BROKEN, [(10, 0), (9, 0)], True, "sdpa_packed"),
        ("auto", BROKEN, [(8, 0)], True, "sdpa_packed"),
        ("auto", BROKEN, [(9, 0)], False, "sdpa_packed"),
        ("auto", BROKEN, None, False, "sdpa_packed"),
        ("fa4", None, [(9, 0)], True, "fa4"),  # asked for, beside a working flash-attn 2
        ("fa4", BROKEN, [(10, 0), (9, 0)], True, "fa4"),
        ("sdpa", None, [(9, 0)], True, "sdpa"),
        ("sdpa_packed", None, [(9, 0)], True, "sdpa_packed"),  # beside a working flash-attn 2
        ("fa2", None, None, False, "fa2"),
    ],
)
def test_the_choice(want, fa2, caps, installed, name, monkeypatch):
    monkeypatch.setattr(att, "fa4_import_problem", lambda: None)  # a module that imports
    choice = att.choose(want, False, fa2, caps, installed)
    assert choice.name == name
    if name == "sdpa_packed" and want == "auto":
        assert choice == att.Choice(
            "sdpa_packed", f"{BROKEN}; packed rows, block-diagonal mask from position_ids"
        )
    if name == "fa4":
        assert choice.why == f"ATTENTION=fa4, compute capability {min(caps)[0]}.0"
        assert choice.cost == att.FA4_COST


def test_auto_on_a_gpu_without_flash_attn_2_packs_under_sdpa():
    """The default of a fresh GPU box (no flash-attn 2 wheel for torch 2.11): sdpa WITH padding
    removal, whatever the card and whether flash-attn 4 is installed."""
    for caps in ([(9, 0)], [(8, 0)], [(12, 0)], [], None):
        for installed in (True, False):
            choice = att.choose("auto", False, BROKEN, caps, installed)
            assert (choice.name, choice.implementation, choice.padding_removal) == (
                "sdpa_packed", "sdpa", True,
            ), (caps, installed)  # fmt: skip
            assert choice.overlay == "sdpa_packed" and choice.cost == ""


@pytest.mark.parametrize(
    ("want", "fa2", "caps", "installed", "refusal"),
    [
        ("fa4", BROKEN, [(8, 0)], True,
         "ATTENTION=fa4: flash-attn-4 needs compute capability 9.0+, this card has 8.0; "
         "use ATTENTION=auto (sdpa_packed)"),
        ("fa4", BROKEN, [(9, 0), (8, 9)], True,  # every GPU must be SM 9+
         "ATTENTION=fa4: flash-attn-4 needs compute capability 9.0+, this card has 8.9; "
         "use ATTENTION=auto (sdpa_packed)"),
        ("fa4", BROKEN, [(9, 0)], False,
         "ATTENTION=fa4: flash-attn-4 not installed on this 9.0 card (FLASH_ATTN=4 bash "
         "scripts/setup.sh installs it); use ATTENTION=auto (sdpa_packed)"),
        ("fa4", BROKEN, [], True,
         "ATTENTION=fa4: flash-attn-4 needs compute capability 9.0+, no GPU seen; "
         "use ATTENTION=auto (sdpa_packed)"),
        ("fa2", BROKEN, [(9, 0)], True, f"ATTENTION=fa2: {BROKEN}"),
        ("fa3", None, None, False,
         "ATTENTION=fa3 is not one of auto, fa2, fa4, sdpa, sdpa_packed"),
    ],
)  # fmt: skip
def test_a_request_the_machine_cannot_meet_is_refused(want, fa2, caps, installed, refusal):
    with pytest.raises(att.AttentionRefused) as refused:
        att.choose(want, False, fa2, caps, installed)
    assert str(refused.value) == refusal


def test_the_cpu_runs_sdpa_padded_and_packs_when_asked():
    assert att.choose("auto", True, None, [(9, 0)], True) == att.Choice(
        "sdpa", "trains on the CPU, where packed steps measured slower"
    )
    assert att.choose("sdpa_packed", True, None, None, False) == att.Choice(
        "sdpa_packed", "ATTENTION=sdpa_packed", att.CPU_PACKED_COST
    )
    assert att.choose("sdpa", True, None, None, False).cost == ""  # the CPU's default
    for want in ("fa4", "fa2"):
        with pytest.raises(att.AttentionRefused, match="the CPU runs sdpa or sdpa_packed only"):
            att.choose(want, True, None, [(9, 0)], True)


def test_the_statement_says_attention_padding_why_and_cost(monkeypatch):
    monkeypatch.setattr(att, "fa4_import_problem", lambda: None)  # a module that imports
    assert att.Choice("sdpa_packed", "x; y").line() == "sdpa, padding removal on (x; y)"
    assert att.choose("fa4", False, None, [(9, 0)], True).line() == (
        "flash_attention_4, padding removal on (ATTENTION=fa4, compute capability 9.0: its packed "
        "backward measured ~20x slower than sdpa_packed's on an H100 (docs/gpu.md))"
    )
    assert att.choose("sdpa", False, None, None, False).line() == (
        "sdpa, padding removal off (ATTENTION=sdpa: the padding computed too, more log-prob "
        "memory than sdpa_packed on a GPU (docs/gpu.md))"
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
    from its dist-info and its module; flash-attn 2's probe is not fooled by FA4's namespace.
    auto packs under sdpa on either card, flash-attn 4 installed or not; fa4 needs SM 9.0."""
    site = plant_flash_attn_4(tmp_path / "site")
    monkeypatch.syspath_prepend(str(site))
    request.addfinalizer(_forget_flash_attn)  # monkeypatch restores sys.path itself
    importlib.invalidate_caches()
    for cap in ("9.0", "8.6"):
        bin_dir = fake_nvidia_smi(tmp_path / f"bin{cap}", [H100], compute_cap=cap)
        monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
        choice = att.probe("auto")
        assert choice.name == "sdpa_packed", choice
        assert choice.why.startswith("flash_attn 2 not installed (flash_attn holds flash-attn-4")
        if cap == "9.0":
            assert att.probe("fa4").name == "fa4"
        else:
            with pytest.raises(att.AttentionRefused, match="this card has 8.6"):
                att.probe("fa4")


def test_the_gpus_are_asked_once_in_one_query(tmp_path: Path, monkeypatch):
    """common/gpus.py: names, memory and capabilities from one nvidia-smi call, asked once per
    nvidia-smi; a driver without compute_cap is asked again without it (capability unknown)."""
    calls = tmp_path / "calls"
    monkeypatch.setenv("FAKE_NVIDIA_SMI_CALLS", str(calls))
    new = fake_nvidia_smi(tmp_path / "new", [H100, A100], compute_cap="9.0")
    for _ in range(3):
        assert gpus.listed(str(new)) == (
            gpus.Gpu(H100[0], H100[1] / 1024, (9, 0)), gpus.Gpu(A100[0], A100[1] / 1024, (9, 0))
        )  # fmt: skip
    assert calls.read_text().splitlines() == [
        "--query-gpu=name,memory.total,compute_cap --format=csv,noheader,nounits"
    ]
    old = fake_nvidia_smi(tmp_path / "old", [A100])
    assert gpus.listed(str(old)) == (gpus.Gpu(A100[0], A100[1] / 1024, None),)
    assert gpus.capabilities(gpus.listed(str(old))) is None
    assert calls.read_text().splitlines()[1:] == [
        "--query-gpu=name,memory.total,compute_cap --format=csv,noheader,nounits",
        "--query-gpu=name,memory.total --format=csv,noheader,nounits",
    ]
    assert gpus.listed(str(tmp_path)) == () and gpus.capabilities(()) == []  # no nvidia-smi
    # a card that reports no memory ([N/A]: unified memory) is still a GPU
    unified = tmp_path / "unified"
    unified.mkdir()
    (unified / "nvidia-smi").write_text('#!/bin/sh\necho "NVIDIA GB10, [N/A], 12.1"\n')
    (unified / "nvidia-smi").chmod(0o755)
    assert gpus.listed(str(unified)) == (gpus.Gpu("NVIDIA GB10", None, (12, 1)),)


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
    """verl 0.9.1 loads the critic with a hard-coded flash_attention_2: under the fa4 choice
    (ATTENTION=fa4) the plugin turns that request into flash_attention_4 in transformers' own
    resolution (which, on this CPU, then refuses FA4 for want of CUDA: the request it refuses is
    the rewritten one)."""
    site = plant_flash_attn_4(tmp_path / "site")
    env = {k: v for k, v in os.environ.items() if k not in USER_KNOBS}
    env["ATTENTION"] = "fa4"
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
            "has 8.0; use ATTENTION=auto (sdpa_packed)"
        ]
        assert result.stdout == ""  # nothing started: no launch line, no preflight
        return
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    line = "flash_attention_4, padding removal on (ATTENTION=fa4, compute capability 9.0: "
    line += f"{att.FA4_COST})"
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


def test_the_memory_estimate_follows_the_packed_overlay():
    """The preflight's memory model reads padding removal from the composed config, so the
    sdpa_packed overlay alone moves the estimate: the PPO recipe's config on Qwen2.5-0.5B, its
    old log-prob pass packed (compiled entropy over the real tokens) far below the padded one
    (eager entropy over twice the budget)."""
    from verl_gsm8k.common.qwen25 import qwen25_config
    from verl_gsm8k.preflight import memory
    from verl_gsm8k.preflight.compose import compose

    config_name, size = "gsm8k_ppo", "0.5B"
    base = gpu_recipe_overrides("ppo_qwen2.5-0.5b_gsm8k")
    one_gpu = ["trainer.n_gpus_per_node=1", "trainer.nnodes=1"]
    old_logprob = {}
    for overlay, packed in (("sdpa", False), ("sdpa_packed", True)):
        cfg = compose(ROOT / "configs", config_name, [*base, *one_gpu, f"+attention={overlay}"])
        for role in ("actor", "critic"):
            assert memory.remove_padding(cfg, role) is packed, (overlay, role)
            assert memory.attention(cfg, role) == "sdpa"
        phases = memory.estimate_phases(cfg, {"actor": qwen25_config(size)})
        old_logprob[overlay] = next(p for p in phases if p.name == "old log-prob").gib(80.0)
    assert old_logprob["sdpa_packed"] < 0.6 * old_logprob["sdpa"], old_logprob


def test_sft_packs_on_the_cpu_when_asked(tiny_model_dir, prepared_sft_dir, tmp_path: Path):
    """ATTENTION=sdpa_packed DEVICE=cpu DRY_RUN=1 of the SFT recipe: the SFT twin
    (configs/attention/sdpa_packed_sft.yaml) composes through the preflight and verl's `--cfg job`,
    and the launch line and the preflight's say packed, and what it costs on a CPU."""
    env = recipe_env(tiny_model_dir, prepared_sft_dir, tmp_path / "runs", DRY_RUN="1",
                     DEVICE="cpu", ATTENTION="sdpa_packed")  # fmt: skip
    env["PATH"] = "/usr/bin:/bin"
    result = run_recipe("sft_qwen2.5-0.5b_gsm8k", env, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    line = f"sdpa, padding removal on (ATTENTION=sdpa_packed: {att.CPU_PACKED_COST})"
    assert f"| attention: {line}" in result.stdout
    assert f"attention: {line}" in next(
        ln for ln in result.stdout.splitlines() if "[ok] device" in ln
    )
    job = composed_config(result.stdout)
    assert job["model"]["use_remove_padding"] is True
    assert job["model"]["override_config"]["attn_implementation"] == "sdpa"
