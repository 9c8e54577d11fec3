"""Which attention a run uses and why (common/attention.py), alike in the launcher, the preflight
and the fallback plugin; a fake nvidia-smi and planted flash_attn packages."""

import importlib
import json
import os
import sys
import textwrap

import pytest
from helpers import (
    ROOT,
    UNDEFINED_SYMBOL,
    USER_KNOBS,
    capture,
    composed_config,
    fake_nvidia_smi,
    plant_flash_attn,
    plant_flash_attn_4,
    recipe_env,
    run_recipe,
    with_pythonpath,
)

from verl_gsm8k.common import attention as att
from verl_gsm8k.common import gpus

H100, A100 = ("NVIDIA H100 80GB HBM3", 81559), ("NVIDIA A100-SXM4-80GB", 81920)
BROKEN = "flash_attn is installed but its CUDA extension flash_attn_2_cuda does not load (...)"
PACKED = f"{BROKEN}; packed rows, block-diagonal mask from position_ids"
FA2 = "flash_attention_2, padding removal on (flash-attn 2 loads)"
NEED = "ATTENTION=fa4: flash-attn-4 needs compute capability 9.0+"
AUTO = "use ATTENTION=auto (sdpa_packed)"
FA4 = "flash_attention_4, padding removal on (ATTENTION=fa4, compute capability 9.0: "
FA4 += f"{att.FA4_COST})"

# (ATTENTION, CPU, flash-attn 2's problem, capabilities, fa4 installed) -> the line or refusal
CASES = [
    ("auto", False, None, [(9, 0)], True, FA2),
    *[("auto", False, BROKEN, caps, fa4, f"sdpa, padding removal on ({PACKED})")
      for caps, fa4 in (([(9, 0)], True), ([(8, 0)], False), (None, True))],
    ("fa4", False, None, [(9, 0)], True, FA4),
    ("fa4", False, BROKEN, [(10, 0), (9, 0)], True, FA4),
    ("sdpa", False, None, [(9, 0)], True, f"sdpa, padding removal off (ATTENTION=sdpa: "
     f"{att.SDPA_COST})"),
    ("sdpa_packed", False, None, None, False, "sdpa, padding removal on (ATTENTION=sdpa_packed)"),
    ("fa2", False, None, None, False, FA2),
    ("auto", True, None, [(9, 0)], True, "sdpa, padding removal off (trains on the CPU, where "
     "packed steps measured slower)"),
    ("sdpa", True, None, None, False, "sdpa, padding removal off (ATTENTION=sdpa)"),
    ("sdpa_packed", True, None, None, False, "sdpa, padding removal on (ATTENTION=sdpa_packed: "
     f"{att.CPU_PACKED_COST})"),
    ("fa4", False, BROKEN, [(8, 0)], True, f"{NEED}, this card has 8.0; {AUTO}"),
    ("fa4", False, BROKEN, [(9, 0), (8, 9)], True, f"{NEED}, this card has 8.9; {AUTO}"),
    ("fa4", False, BROKEN, [(9, 0)], False, "ATTENTION=fa4: flash-attn-4 not installed on this "
     f"9.0 card (FLASH_ATTN=4 bash scripts/setup.sh installs it); {AUTO}"),
    ("fa4", False, BROKEN, [], True, f"{NEED}, no GPU seen; {AUTO}"),
    ("fa4", False, BROKEN, None, True, f"{NEED}, nvidia-smi does not report it; {AUTO}"),
    ("fa2", False, BROKEN, [(9, 0)], True, f"ATTENTION=fa2: {BROKEN}"),
    ("fa3", False, None, None, False, "ATTENTION=fa3 is not one of auto, fa2, fa4, sdpa, "
     "sdpa_packed"),
    ("fa4", True, None, [(9, 0)], True, "ATTENTION=fa4: the CPU runs sdpa or sdpa_packed only "
     "(DEVICE=cpu)"),
]  # fmt: skip


@pytest.mark.parametrize(("want", "cpu", "fa2", "caps", "fa4", "said"), CASES)
def test_the_choice_and_its_line(want, cpu, fa2, caps, fa4, said, monkeypatch):
    monkeypatch.setattr(att, "fa4_import_problem", lambda: None)  # a module that imports
    try:
        choice = att.choose(want, cpu, fa2, caps, fa4)
    except att.AttentionRefused as refused:
        assert str(refused) == said
        return
    assert choice.line() == said
    assert (choice.implementation, choice.padding_removal) == att.PATHS[choice.name][:2]


def test_the_capability_floor_is_transformers_own():
    from transformers.modeling_flash_attention_utils import FLASH_ATTENTION_COMPATIBILITY_MATRIX

    assert FLASH_ATTENTION_COMPATIBILITY_MATRIX[4]["cuda_min_major_version"] == 9
    assert att.FA4_MIN_CAPABILITY == (9, 0)


def test_the_probe_reads_nvidia_smi_and_the_installed_package(tmp_path, monkeypatch, request):
    monkeypatch.syspath_prepend(str(plant_flash_attn_4(tmp_path / "site")))
    request.addfinalizer(lambda: [sys.modules.pop(m) for m in list(sys.modules)
                                  if m.split(".")[0] == "flash_attn"])  # fmt: skip
    importlib.invalidate_caches()
    for cap in ("9.0", "8.6"):
        bin_dir = fake_nvidia_smi(tmp_path / f"bin{cap}", [H100], compute_cap=cap)
        monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
        assert att.probe("auto").why.startswith("flash_attn 2 not installed (flash_attn holds")
        if cap == "9.0":
            assert att.probe("fa4").name == "fa4"
        else:
            with pytest.raises(att.AttentionRefused, match="this card has 8.6"):
                att.probe("fa4")


def test_the_gpus_are_asked_once_in_one_query(tmp_path, monkeypatch):
    calls = tmp_path / "calls"
    monkeypatch.setenv("FAKE_NVIDIA_SMI_CALLS", str(calls))
    new, old = (fake_nvidia_smi(tmp_path / "new", [H100, A100], "9.0"),
                fake_nvidia_smi(tmp_path / "old", [A100]))  # fmt: skip
    for _ in range(3):
        assert gpus.listed(str(new)) == (gpus.Gpu(H100[0], H100[1] / 1024, (9, 0)),
                                         gpus.Gpu(A100[0], A100[1] / 1024, (9, 0)))  # fmt: skip
    assert gpus.listed(str(old)) == (gpus.Gpu(A100[0], A100[1] / 1024, None),)
    assert gpus.capabilities(gpus.listed(str(old))) is None
    query = "--query-gpu=name,memory.total{} --format=csv,noheader,nounits"
    assert calls.read_text().splitlines() == [query.format(",compute_cap")] * 2 + [query.format("")]
    assert gpus.listed(str(tmp_path)) == () and gpus.capabilities(()) == []  # no nvidia-smi
    smi = tmp_path / "unified" / "nvidia-smi"  # a card without its memory: still a GPU
    smi.parent.mkdir()
    smi.write_text('#!/bin/sh\necho "NVIDIA GB10, [N/A], 12.1"\n')
    smi.chmod(0o755)
    assert gpus.listed(str(tmp_path / "unified")) == (gpus.Gpu("NVIDIA GB10", None, (12, 1)),)


@pytest.mark.parametrize("config", ["gsm8k_ppo", "gsm8k_sft"])
def test_each_overlay_composes_with_verls_config_as_the_choice_says(config):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    suffix = "_sft" if config == "gsm8k_sft" else ""
    for name, (implementation, padding, overlay) in att.PATHS.items():
        if overlay is None:
            continue
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base=None):
            cfg = compose(config, [f"+attention={overlay}{suffix}"])
        models = [cfg.model] if suffix else [cfg.actor_rollout_ref.model, cfg.critic.model]
        for model in models:
            assert model.override_config.attn_implementation == implementation, name
            assert model.use_remove_padding is padding, name


def h100_env(tmp_path, **changes: str | None) -> dict[str, str]:
    """This environment but the user's knobs, an H100 of SM 9.0 on PATH; ``changes`` (None: out)."""
    env = {k: v for k, v in os.environ.items() if k not in USER_KNOBS}
    env["PATH"] = f"{fake_nvidia_smi(tmp_path / 'bin', [H100], '9.0')}:{env['PATH']}"
    env.update(changes)
    return {k: v for k, v in env.items() if v is not None}


AGREE = """
    import json, os
    from omegaconf import OmegaConf
    from verl_gsm8k.common.attention import flash_attn_problem
    import verl_gsm8k.verl_plugins.attention_fallback as fallback
    from verl_gsm8k.launch.plan import Recipe, make_plan
    from verl_gsm8k.preflight.device import check_device
    from verl_gsm8k.preflight.lines import Report
    plan = make_plan(Recipe("probe", "gsm8k_ppo"), os.environ)
    os.environ["VERL_USE_EXTERNAL_MODULES"] = plan.exports["VERL_USE_EXTERNAL_MODULES"]
    cfg = OmegaConf.create({"trainer": {"device": "cuda"}, "actor_rollout_ref": {"model": {
        "use_remove_padding": True, "override_config": {"attn_implementation": "sdpa"}}}})
    report = Report()
    check_device(cfg, True, report)
    print(json.dumps([flash_attn_problem(), fallback.install(), plan.attention_line,
                      plan.device_overrides, plan.exports["VERL_USE_EXTERNAL_MODULES"],
                      report.lines[-1]]))
"""


@pytest.mark.parametrize("case", ["broken", "working", "absent"])
def test_launcher_preflight_and_plugin_agree(case, tmp_path):
    assert importlib.util.find_spec("flash_attn") is None  # this machine's own: none
    if case != "absent":
        plant_flash_attn(tmp_path, works=case == "working")
    env = with_pythonpath(h100_env(tmp_path, DEVICE=None, VERL_USE_EXTERNAL_MODULES=""), tmp_path)
    out = capture([sys.executable, "-c", textwrap.dedent(AGREE)], 0, 300, env=env)
    problem, plugin, line, overlays, modules, device = json.loads(out.stdout.splitlines()[-1])
    assert plugin == ("+attention=sdpa_packed" in overlays) == (problem is not None)
    assert plugin == ("verl_gsm8k.verl_plugins.attention_fallback" in modules)
    if case == "working":
        assert line == FA2
        assert "attention: sdpa, padding removal on (set by the overrides; ATTENTION=auto " \
            "chooses fa2 here: flash-attn 2 loads)" in device  # fmt: skip
        return
    broken = BROKEN.replace("...", f"ImportError: {UNDEFINED_SYMBOL}")
    why = "flash_attn not installed" if case == "absent" else broken
    assert problem == why
    assert line == f"sdpa, padding removal on ({PACKED.replace(BROKEN, why)})"
    assert device.endswith(f"attention: {line}")


def test_the_plugin_gives_the_critic_flash_attention_4(tmp_path):
    env = h100_env(tmp_path, ATTENTION="fa4")
    code = textwrap.dedent("""
        import verl_gsm8k.verl_plugins.attention_fallback as p
        from transformers import Qwen2Config, Qwen2ForCausalLM
        choice = p.current_choice()
        print(p.install(), choice.name, p.rewrite("flash_attention_2", choice),
              p.rewrite("sdpa", choice))
        model = Qwen2ForCausalLM(Qwen2Config(hidden_size=16, intermediate_size=32, vocab_size=64,
                                 num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1))
        try:
            model._check_and_adjust_attn_implementation("flash_attention_2", is_init_check=True)
        except Exception as exc:
            print("refused:", exc)
    """)
    env = with_pythonpath(env, plant_flash_attn_4(tmp_path / "site"))
    out = capture([sys.executable, "-c", code], 0, 300, env=env)
    first, refused, *_ = out.stdout.splitlines()
    assert first == "True fa4 flash_attention_4 sdpa"
    assert refused.startswith("refused: FlashAttention4 has been toggled on"), refused


@pytest.mark.parametrize("card", ["H100", "A100"])
def test_the_launcher_chooses_fa4_on_sm90_and_refuses_it_below(
    card, tiny_model_dir, prepared_gsm8k_dir, tmp_path
):
    gpu, cap = {"H100": (H100, "9.0"), "A100": (A100, "8.0")}[card]
    env = recipe_env(tiny_model_dir, prepared_gsm8k_dir, tmp_path / "runs", DRY_RUN="1",
                     ATTENTION="fa4", TRAIN_BATCH_SIZE="16", PPO_MINI_BATCH_SIZE="8")  # fmt: skip
    env["PATH"] = f"{fake_nvidia_smi(tmp_path / 'bin', [gpu], cap)}:{env['PATH']}"
    env = with_pythonpath(env, plant_flash_attn_4(tmp_path / "site"))
    result = run_recipe("ppo_qwen2.5-0.5b_gsm8k", env, timeout=600)
    if card == "A100":
        assert (result.returncode, result.stdout) == (2, "")  # no launch line, no preflight
        assert result.stderr.strip().splitlines() == [f"attention: {NEED}, this card has 8.0; "
                                                      f"{AUTO}"]  # fmt: skip
        return
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert f"| attention: {FA4}" in result.stdout
    assert f"attention: {FA4}" in next(ln for ln in result.stdout.splitlines()
                                        if "[ok] device" in ln)  # fmt: skip
    job = composed_config(result.stdout)
    for model in (job["actor_rollout_ref"]["model"], job["critic"]["model"]):
        assert model["override_config"]["attn_implementation"] == "flash_attention_4"
        assert model["use_remove_padding"] is True


def test_a_working_flash_attn_2_comes_first_on_the_command_line(tmp_path):
    env = h100_env(tmp_path)
    env = with_pythonpath(env, plant_flash_attn(tmp_path, works=True))
    out = capture([sys.executable, "-m", "verl_gsm8k.common.attention"], None, 120, env=env)
    assert out.stdout.splitlines() == ["fa2", FA2]
