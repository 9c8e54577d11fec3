"""rewards/gsm8k.py against verl 0.9.1: its built-in GSM8K scorer, its loader, its reward managers.

* Agreement: where verl's built-in scorer is right, ours gives the same score; the places where
  the two differ are pinned in DIFFERENCES (the same table is in docs/reward.md).
* Wiring: verl's own loader (``reward.custom_reward_function.path/name``), the reward-loop worker
  that ``main_ppo`` runs (on a Hydra-composed ``ppo_trainer`` config) and the legacy naive
  reward manager all call OUR function: a response only ours credits proves it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf
from test_reward import REASONING, _gsm8k_rows, _reference_truth
from verl import DataProto
from verl.trainer.ppo.reward import get_custom_reward_fn
from verl.utils.reward_score import default_compute_score
from verl.utils.reward_score import gsm8k as verl_gsm8k

from rewards.gsm8k import REWARD_FUNCTIONS, compute_score

REPO = Path(__file__).resolve().parents[1]
REWARD_PATH = str(REPO / "rewards" / "gsm8k.py")
# Only our scorer credits this (verl's regex stops at "$"): seeing 1.0 proves ours ran.
PROOF = "She pays 1,234 dollars.\n#### $1,234.00"


def _ours(response, truth) -> float:
    return compute_score("openai/gsm8k", response, truth)["score"]


def _verl(response, truth) -> float:
    return float(verl_gsm8k.compute_score(response, truth))


# ---------------------------------------------------------------- agreement with verl

# (response, ground truth, score both give): cases where verl's built-in scorer is right
AGREEMENT = [
    pytest.param(REASONING + "#### 72", "72", 1.0, id="plain"),
    pytest.param("#### 1,200", "1200", 1.0, id="thousands-comma"),
    pytest.param("#### -3", "-3", 1.0, id="negative"),
    pytest.param("#### 0.5", "0.5", 1.0, id="decimal"),
    pytest.param("#### 18 dollars", "18", 1.0, id="unit-word"),
    pytest.param("#### 18%", "18", 1.0, id="percent"),
    pytest.param("**#### 18**", "18", 1.0, id="bold-line"),
    pytest.param("#### 18\n", "18", 1.0, id="newline"),
    pytest.param("#### 18 ####", "18", 1.0, id="closing-marker"),
    pytest.param("#### 18\n####", "18", 1.0, id="trailing-empty-marker"),
    pytest.param(REASONING + "#### 71", "72", 0.0, id="wrong"),
    pytest.param("#### 720", "72", 0.0, id="720-vs-72"),
    pytest.param("#### 7.2", "72", 0.0, id="7.2-vs-72"),
    pytest.param("#### 72\nNo, wait.\n#### 70", "72", 0.0, id="right-before-last-marker"),
    pytest.param(REASONING + "The answer is 72.", "72", 0.0, id="no-marker"),
    pytest.param("\\boxed{72}", "72", 0.0, id="boxed-only"),
    pytest.param("", "72", 0.0, id="empty"),
]


@pytest.mark.parametrize(("response", "truth", "expected"), AGREEMENT)
def test_agrees_with_verl_where_verl_is_right(response, truth, expected):
    assert _verl(response, truth) == expected
    assert _ours(response, truth) == expected


# (response, ground truth, verl's score, our score): every known difference, and why.
DIFFERENCES = [
    pytest.param("#### $18", "18", 0.0, 1.0, id="dollar: '$' is outside verl's [0-9.,] capture"),
    pytest.param("#### -$5", "-5", 0.0, 1.0, id="minus-dollar: same"),
    pytest.param("#### 18.00", "18", 0.0, 1.0, id="decimals: verl compares strings"),
    pytest.param("#### 18.", "18", 0.0, 1.0, id="period: verl captures '18.'"),
    pytest.param("#### 018", "18", 0.0, 1.0, id="leading-zero: string compare"),
    pytest.param("####18", "18", 0.0, 1.0, id="no-space: verl needs exactly '#### '"),
    pytest.param("####  18", "18", 0.0, 1.0, id="two-spaces: same"),
    pytest.param("#### **18**", "18", 0.0, 1.0, id="bold-number: '*' stops verl's regex"),
    pytest.param("#### \\boxed{18}", "18", 0.0, 1.0, id="boxed-after-marker: same"),
    pytest.param("#### .5", "0.5", 0.0, 1.0, id="leading-dot: string compare"),
    pytest.param("#### 3/4", "0.75", 0.0, 1.0, id="fraction: verl reads '3'"),
    pytest.param(
        "#### 18\n" + "I checked it twice. " * 20,
        "18",
        0.0,
        1.0,
        id="marker-400-chars-from-end: verl reads the last 300 chars, we 2000",
    ),
    pytest.param("#### 1,200", "1,200", 0.0, 1.0, id="truth-with-comma: verl keeps GT as is"),
    pytest.param("#### 18", 18, 0.0, 1.0, id="int-truth: verl compares str with int"),
    pytest.param("#### 1,2", "12", 1.0, 0.0, id="bad-commas: verl drops every comma"),
    pytest.param("#### 1,2345", "12345", 1.0, 0.0, id="bad-grouping: same"),
    pytest.param("#### 12 or 13", "12", 1.0, 0.0, id="hedged-or: verl reads the first number"),
    pytest.param("#### 12-13", "12", 1.0, 0.0, id="hedged-range: '-' stops verl's regex"),
    pytest.param("#### 5 apples and 6 pears", "5", 1.0, 0.0, id="hedged-quantities: same"),
    pytest.param("#### 125,96", "12596", 1.0, 0.0, id="hedged-list: verl drops every comma"),
    pytest.param("#### 1,2,3,4,5", "12345", 1.0, 0.0, id="hedged-long-list: same"),
]


@pytest.mark.parametrize(("response", "truth", "verl_score", "our_score"), DIFFERENCES)
def test_documented_differences_from_verl(response, truth, verl_score, our_score):
    assert _verl(response, truth) == verl_score
    assert _ours(response, truth) == our_score
    doc = (REPO / "docs" / "reward.md").read_text(encoding="utf-8")
    assert f"`{response.splitlines()[0]}`" in doc  # each difference is listed in the docs


def test_none_response_verl_raises_ours_scores_zero():
    with pytest.raises(TypeError):
        verl_gsm8k.compute_score(None, "18")
    assert _ours(None, "18") == 0.0


@settings(max_examples=200, deadline=None)
@given(
    prose=st.text(alphabet="abcdefghij klmnop=+-*.,\n0123456789", max_size=1500),
    n=st.integers(min_value=-(10**8), max_value=10**9),
    other=st.integers(min_value=-(10**8), max_value=10**9),
    commas=st.booleans(),
    suffix=st.sampled_from(["", "\n", " dollars", "%", " apples in total.\n", "\n\nDone!"]),
    right=st.booleans(),
)
def test_agrees_with_verl_on_well_formed_answers(prose, n, other, commas, suffix, right):
    response = f"{prose}\n#### {n:,}{suffix}" if commas else f"{prose}\n#### {n}{suffix}"
    truth = str(n if right else other)
    assert _ours(response, truth) == _verl(response, truth)


def test_agrees_with_verl_on_every_gsm8k_reference_solution():
    rows = _gsm8k_rows()
    disagreements, hedged = [], []
    for index, row in enumerate(rows):
        truth = _reference_truth(row["answer"])
        head, _, _ = row["answer"].rpartition("#### ")
        for response, expected in ((row["answer"], 1.0), (f"{head}#### {int(truth) - 1}", 0.0)):
            scores = (_verl(response, truth), _ours(response, truth))
            if scores != (expected, expected):
                disagreements.append((index, response[-40:], truth, scores))
        # the same solution hedging between its answer and the next number: verl credits it
        hedge = f"{head}#### {truth} or {int(truth) + 1}"
        hedged.append((_verl(hedge, truth), _ours(hedge, truth)))
    assert disagreements == []
    assert len(hedged) == 8792 and set(hedged) == {(1.0, 0.0)}


# ---------------------------------------------------------------- verl's loader


def _reward_config(name: str, **reward_kwargs) -> OmegaConf:
    fn = {"path": REWARD_PATH, "name": name, "reward_kwargs": reward_kwargs}
    return OmegaConf.create({"reward": {"custom_reward_function": fn}})


@pytest.mark.parametrize("name", sorted(REWARD_FUNCTIONS))
def test_verl_loader_calls_our_function(name):
    loaded = get_custom_reward_fn(_reward_config(name, unused_kwarg=1))
    call = {"data_source": "openai/gsm8k", "solution_str": PROOF, "ground_truth": "1234"}
    assert default_compute_score(**call) == 0.0  # verl's own GSM8K scorer rejects PROOF
    result = loaded(**call, extra_info={})
    assert result == REWARD_FUNCTIONS[name](**call)
    assert result["acc"] == 1.0
    assert "clipped" in result  # a diagnostic only our scorer returns


def test_verl_loader_rejects_an_unknown_name():
    with pytest.raises(AttributeError):
        get_custom_reward_fn(_reward_config("compute_score_typo"))


# ---------------------------------------------------------------- verl's reward managers

BATCH = [  # (response, ground truth)
    (REASONING + "#### 72", "72"),  # every scorer credits it
    (PROOF, "1234"),  # only ours credits it
    ("I think it is 70.\n#### 70", "72"),  # wrong; compute_score_format gives FORMAT_WEIGHT
    ("So the answer is \\boxed{72}.", "72"),  # right, but no marker
]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def _data_proto(tokenizer, rows=BATCH, prompt_len=48, response_len=64) -> DataProto:
    """A rollout batch as verl builds it: left-padded prompts, right-padded responses + EOS."""
    pad = tokenizer.pad_token_id
    prompts, responses, masks = [], [], []
    for response, _ in rows:
        chat = [{"role": "user", "content": "How many clips did Natalia sell?"}]
        text = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
        prompt_ids = tokenizer(text, add_special_tokens=False)["input_ids"][-prompt_len:]
        response_ids = tokenizer(response, add_special_tokens=False)["input_ids"]
        assert tokenizer.decode(response_ids, skip_special_tokens=True) == response
        response_ids = (response_ids + [tokenizer.eos_token_id])[:response_len]
        prompt_pad, response_pad = prompt_len - len(prompt_ids), response_len - len(response_ids)
        prompts.append([pad] * prompt_pad + prompt_ids)
        responses.append(response_ids + [pad] * response_pad)
        masks.append(
            [0] * prompt_pad + [1] * (len(prompt_ids) + len(response_ids)) + [0] * response_pad
        )
    prompts_t, responses_t = torch.tensor(prompts), torch.tensor(responses)
    return DataProto.from_dict(
        tensors={
            "prompts": prompts_t,
            "responses": responses_t,
            "input_ids": torch.cat([prompts_t, responses_t], dim=1),
            "attention_mask": torch.tensor(masks),
        },
        non_tensors={
            "data_source": np.array(["openai/gsm8k"] * len(rows), dtype=object),
            "reward_model": np.array(
                [{"style": "rule", "ground_truth": truth} for _, truth in rows], dtype=object
            ),
        },
    )


def _composed_config(overrides: list[str]):
    """The ppo_trainer config exactly as main_ppo composes it, with our overrides."""
    import verl
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    config_dir = str(Path(verl.__file__).parent / "trainer" / "config")
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose(config_name="ppo_trainer", overrides=overrides)


def _reward_loop_scores(tiny_model_dir, overrides: list[str], tokenizer) -> list[dict]:
    from verl.experimental.reward_loop import RewardLoopWorker

    config = _composed_config([f"actor_rollout_ref.model.path={tiny_model_dir}", *overrides])
    worker = RewardLoopWorker(config)  # what main_ppo runs as a Ray actor, here in-process
    return worker.loop.run_until_complete(worker.compute_score_batch(_data_proto(tokenizer)))


@pytest.mark.parametrize("name", sorted(REWARD_FUNCTIONS))
def test_reward_loop_worker_runs_our_function(name, tiny_model_dir, tokenizer):
    overrides = [
        f"reward.custom_reward_function.path={REWARD_PATH}",
        f"reward.custom_reward_function.name={name}",
    ]
    outputs = _reward_loop_scores(tiny_model_dir, overrides, tokenizer)
    assert len(outputs) == len(BATCH)
    for output, (response, truth) in zip(outputs, BATCH, strict=True):
        expected = REWARD_FUNCTIONS[name]("openai/gsm8k", response, truth)
        assert output["reward_score"] == expected["score"]
        assert output["reward_extra_info"] == expected
    assert outputs[1]["reward_score"] == 1.0  # PROOF: only our scorer credits it


def test_reward_loop_worker_without_custom_function_uses_verl_default(tiny_model_dir, tokenizer):
    # the control: same batch, no custom path -> verl's built-in scorer, which rejects PROOF
    outputs = _reward_loop_scores(tiny_model_dir, [], tokenizer)
    assert [output["reward_score"] for output in outputs] == [1.0, 0.0, 0.0, 0.0]
    assert "clipped" not in outputs[0]["reward_extra_info"]


def test_legacy_naive_reward_manager_runs_our_function(tokenizer):
    from verl.workers.reward_manager.naive import NaiveRewardManager

    loaded = get_custom_reward_fn(_reward_config("compute_score_format"))
    manager = NaiveRewardManager(tokenizer=tokenizer, num_examine=0, compute_score=loaded)
    data = _data_proto(tokenizer)
    result = manager(data, return_dict=True)
    rewards, extra = result["reward_tensor"], result["reward_extra_info"]
    prompt_len = data.batch["prompts"].shape[1]
    last = data.batch["attention_mask"][:, prompt_len:].sum(dim=1) - 1
    for i, (response, truth) in enumerate(BATCH):
        expected = REWARD_FUNCTIONS["compute_score_format"]("openai/gsm8k", response, truth)
        assert rewards[i, last[i]].item() == pytest.approx(expected["score"])
        assert rewards[i].sum().item() == pytest.approx(expected["score"])  # one token only
        assert {key: values[i] for key, values in extra.items()} == expected
