"""The per-token trace without a training run: which responses, the lines, the writer, the
preflight's view (real runs against verl's numbers: tests/test_learn_cpu.py)."""

import json
import math
from pathlib import Path

import pytest
from helpers import composed_config, get, launch_in_process, recipe_env

from verl_gsm8k.guard.rules import prompt_of
from verl_gsm8k.trace.record import TraceWriter, clean, sample_line, step_line
from verl_gsm8k.trace.select import choose


def keys(prompts: int, n: int) -> list[str]:
    return [f"uid{p:02d}_{s}_0" for p in range(prompts) for s in range(n)]


def test_whole_groups_are_traced_in_a_deterministic_order():
    all_keys = keys(16, 8)
    chosen = choose(all_keys, step=3, samples=4)
    assert len(chosen) == 8 and len({prompt_of(k) for k in chosen}) == 1  # one whole group
    assert [k.rsplit("_", 2)[1] for k in chosen] == [str(s) for s in range(8)]
    assert choose(list(reversed(all_keys)), step=3, samples=4) == chosen  # order-independent
    assert choose(all_keys, step=4, samples=4) != chosen  # another prompt the next step
    assert len(choose(all_keys, step=3, samples=9)) == 16  # two groups to reach 9
    assert choose(all_keys, step=3, samples=0) == []
    assert len(choose(keys(64, 1), step=1, samples=4)) == 4  # PPO with n=1: four prompts
    assert prompt_of("not-a-verl-key") == "not-a-verl-key"


def test_a_trace_line_keeps_what_exists_and_names_what_does_not():
    line = sample_line(
        step=2, key="u_0_0", uid="u", session=0, prompt_ids=[1, 2], response_ids=[3, 4, 5],
        response_mask=[1, 1, 1],
        per_token={"score": [0.0, 0.0, 1.0], "advantage": [0.5, float("nan"), math.inf]},
        absent={"value": "no critic (algorithm.adv_estimator=grpo)"},
        decode=lambda i: f"<{i}>", ground_truth="5", data_source="openai/gsm8k",
        reward_extra={"acc": 1.0},
    )  # fmt: skip
    assert line["score"] == 1.0 and line["response"]["tokens"] == ["<3>", "<4>", "<5>"]
    assert line["per_token"]["advantage"] == [0.5, None, None]  # JSON has no NaN/Infinity
    assert "value" not in line["per_token"] and "critic" in line["absent"]["value"]
    json.dumps(line, allow_nan=False)
    with pytest.raises(ValueError, match="2 values for 3 response tokens"):
        sample_line(
            step=2, key="u_0_0", uid="u", session=0, prompt_ids=[1], response_ids=[3, 4, 5],
            response_mask=[1, 1, 1], per_token={"value": [0.1, 0.2]}, absent={},
            decode=str,
        )  # fmt: skip
    assert clean(0.123456789) == 0.1234568 and clean({"a": [1, None]}) == {"a": [1, None]}
    line = step_line(5, {"adv_estimator": "gae"}, {"actor/pg_loss": 0.1, "note": "x"}, 8, 128)
    assert line["metrics"] == {"actor/pg_loss": 0.1} and (line["traced"], line["of"]) == (8, 128)


def test_the_writer_writes_whole_files_and_survives_a_failure(tmp_path: Path):
    writer = TraceWriter(tmp_path / "trace")
    writer.submit(1, [{"kind": "step", "step": 1}])
    writer.submit(2, [{"kind": "step", "step": 2}, {"kind": "sample"}])
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    broken = TraceWriter(blocked / "trace")
    broken.submit(1, [{"kind": "step"}])
    writer.close()
    broken.close()
    assert sorted(p.name for p in (tmp_path / "trace").iterdir()) == ["1.jsonl", "2.jsonl"]
    assert len((tmp_path / "trace" / "2.jsonl").read_text().splitlines()) == 2
    assert broken.failures == 1  # logged once, never raised into training


def test_recipes_trace_by_default_and_say_when_it_is_off(tiny_model_dir, prepared_gsm8k_dir,
                                                         tmp_path):  # fmt: skip
    env = recipe_env(tiny_model_dir, prepared_gsm8k_dir, tmp_path / "runs", DRY_RUN="1",
                     DEVICE="cpu")  # fmt: skip
    on = launch_in_process("grpo_qwen2.5-0.5b_gsm8k", env)
    assert on.returncode == 0, on.stdout[-3000:] + on.stderr[-3000:]
    assert "preflight: [ok] trace: 4 responses per step (whole prompt groups of rollout.n=5)" in (
        on.stdout)  # fmt: skip
    cfg = composed_config(on.stdout)
    assert get(cfg, "trainer.v1.trainer_mode") == "gsm8k"
    assert get(cfg, "gsm8k_trace.samples") == 4
    off = launch_in_process("grpo_qwen2.5-0.5b_gsm8k", dict(env, TRACE_SAMPLES="0"))
    assert off.returncode == 0, off.stdout[-3000:] + off.stderr[-3000:]
    assert "preflight: [ok] trace: TracingTrainer selected, gsm8k_trace.samples=0" in off.stdout
    assert get(composed_config(off.stdout), "trainer.v1.trainer_mode") == "gsm8k"
