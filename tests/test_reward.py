"""rewards/gsm8k.py: tables, properties, hostile input, real GSM8K, verl running it."""

import json
import math
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import ROOT, require_shared
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from verl import DataProto
from verl.utils.reward_score import gsm8k as verl_gsm8k

from rewards import gsm8k as rg
from rewards.gsm8k import ACC_WEIGHT, FORMAT_WEIGHT, REWARD_FUNCTIONS, TAIL_CHARS

STRICT, FLEX, FORMAT = rg.compute_score, rg.compute_score_flexible, rg.compute_score_format
ALL, FLEXIBLES = (STRICT, FLEX, FORMAT), (FLEX, FORMAT)
REASONING = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nIn all 48+24 = <<48+24=72>>72.\n"
PROOF = "She pays 1,234 dollars.\n#### $1,234.00"  # only ours credits it: seeing 1.0 proves ours


def call(fn, solution, truth) -> dict:
    result = fn(data_source="openai/gsm8k", solution_str=solution, ground_truth=truth)
    assert set(result) == set(rg.KEYS)
    assert all(type(v) is float and math.isfinite(v) for v in result.values()), result
    assert 0 <= result["score"] <= 1 and {result[k] for k in rg.KEYS[1:]} <= {0.0, 1.0}
    return result


def verl(response, truth) -> float:
    return float(verl_gsm8k.compute_score(response, truth))


# (response, truth, compute_score, verl's built-in scorer or None): every tolerated form of
# docs/guide.md scores 1; where verl differs, docs/reward.md lists the response.
CASES = [
    (REASONING + "#### 72", "72", 1, 1), ("#### $18", "18", 1, 0), ("#### $ 72", "72", 1, None),
    ("#### -$5", "-5", 1, 0), ("#### $-5", "-5", 1, None), ("#### \u22125", "-5", 1, None),
    ("#### 1,200", "1200", 1, 1), ("#### 1200", "1,200", 1, None), ("#### 1,200", "1,200", 1, 0),
    ("#### $1,234,567.00", "1234567", 1, None), ("#### 18.", "18", 1, 0),
    ("#### 18%", "18", 1, 1), ("#### 18 dollars", "18", 1, 1), ("#### 5 hours.", "5", 1, None),
    ("#### **18**", "18", 1, 0), ("**#### 18**", "18", 1, 1), ("#### **$18.00**", "18", 1, None),
    ("####18", "18", 1, 0), ("####  18", "18", 1, 0), ("####\n18", "18", 1, None),
    ("#### 18.00", "18", 1, 0), ("#### 18.0", "18.00", 1, None), ("#### 018", "18", 1, 0),
    ("#### .5", "0.5", 1, 0), ("#### 0.5", ".5", 1, None), ("#### 1/2", ".5", 1, None),
    ("#### 3/4", "0.75", 1, 0), ("#### \\frac{3}{4}", "0.75", 1, None), ("#### -3", "-3", 1, 1),
    ("#### - 5", "-5", 1, None), ("#### 12 m^2", "12", 1, None), ("#### 8 cm^{3}", "8", 1, None),
    ("#### 7 m²", "7", 1, None), ("#### The answer is 42", "42", 1, None),
    ("#### 42\r\n", "42", 1, None), ("#### 18 ####", "18", 1, 1), ("#### 18\n####", "18", 1, 1),
    ("#### Step 1\nadd\n#### 42", "42", 1, None), ("#### 7\n#### 5/0", "7", 1, None),
    ("#### \\boxed{18}", "18", 1, 0), ("#### 18\n" + "I checked it twice. " * 20, "18", 1, 0),
    ("#### 42", 42, 1, None), ("#### 18", 18, 1, 0), ("#### 42", 42.0, 1, None),
    ("#### 1200", REASONING + "#### 1,200", 1, None), ("#### 72 (72 clips)", "72", 1, None),
    ("#### 3/4 = 0.75", "0.75", 1, None), ("#### 72\nBecause 48 + 24 = 72, not 70.", "72", 1, None),
    (REASONING + "#### 71", "72", 0, 0), ("#### 720", "72", 0, 0), ("#### 7.2", "72", 0, 0),
    ("#### 72", "7.2", 0, None), ("#### 72\nWait.\n#### 70", "72", 0, 0),
    ("The answer is 72 ####", "72", 0, None), (REASONING + "The answer is 72.", "72", 0, 0),
    ("\\boxed{72}", "72", 0, 0), ("#### seventy-two", "72", 0, None), ("#### 3/4", "3", 0, None),
    ("#### 5/0", "5", 0, None), ("#### 5", "-5", 0, None), ("#### - 5", "5", 0, None),
    ("#### 72\n" + "x " * TAIL_CHARS, "72", 0, None), ("#### 72", "", 0, None),
    ("#### 72", None, 0, None), ("", "72", 0, 0), (None, "72", 0, None),
    ("#### 1,2", "12", 0, 1), ("#### 1,2345", "12345", 0, 1), ("#### 12 or 13", "12", 0, 1),
    ("#### 12-13", "12", 0, 1), ("#### 5 apples and 6 pears", "5", 0, 1),
    ("#### 125,96", "12596", 0, 1), ("#### 1,2,3,4,5", "12345", 0, 1),
]  # fmt: skip


@pytest.mark.parametrize(("response", "truth", "ours", "theirs"), CASES)
def test_compute_score_and_verls_scorer(response, truth, ours, theirs):
    strict = call(STRICT, response, truth)
    assert strict["score"] == strict["acc"] == ours
    if ours:  # a right marker answer is right for every scorer
        assert call(FLEX, response, truth)["score"] == call(FORMAT, response, truth)["score"] == 1
    if theirs is not None:
        assert verl(response, truth) == theirs
    if theirs is not None and theirs != ours:  # each difference is listed in the docs
        assert f"`{response.splitlines()[0]}`" in (ROOT / "docs" / "reward.md").read_text()


# (response, truth, compute_score_flexible): and its order marker > box > tag > "answer is" > last
FLEXIBLE = [
    ("So it is \\boxed{72}.", "72", 1), ("\\boxed{\\$1{,}200}", "1200", 1),
    ("\\boxed{\\frac{3}{4}}", "0.75", 1), ("\\boxed{\\text{\\textbf{72}} apples}", "72", 1),
    ("<think>48+24</think>\n<answer>\n $72.00 \n</answer>", "72", 1),
    ("So the answer is 72.", "72", 1), ("Final Answer: $1,200\n(1,000 per box)", "1200", 1),
    ("THE ANSWER IS 72 apples.", "72", 1), ("She sold 48 + 24 = 72", "72", 1),
    ("#### 72\nso \\boxed{70}", "72", 1), ("\\boxed{72}. The answer is 70", "72", 1),
    ("<answer>72</answer> in 5 steps", "72", 1), ("The answer is 72.\nCheck: 72 - 2", "72", 1),
    ("\\boxed{70} then \\boxed{72}", "72", 1), ("\\boxed{72}\n<answer>70</answer>", "72", 1),
    ("\\boxed{72} and an unclosed \\boxed{70", "70", 1), ("#### 70\n\\boxed{72}", "72", 0),
    ("\\boxed{72}\nThe answer is 70", "70", 0), ("I do not know.", "72", 0), (None, "72", 0),
]  # fmt: skip


@pytest.mark.parametrize(("response", "truth", "expected"), FLEXIBLE)
def test_compute_score_flexible(response, truth, expected):
    result = call(FLEX, response, truth)
    assert result["acc"] == result["score"] == expected


def test_format_score_weights_the_marker():
    assert (ACC_WEIGHT, FORMAT_WEIGHT) == (0.8, 0.2)  # docs/reward.md states these
    cases = {"#### 72": 1.0, "\\boxed{72}": 0.8, "#### 70": 0.2, "#### none": 0.0, "70": 0.0}
    for response, score in cases.items():
        assert call(FORMAT, response, "72")["score"] == pytest.approx(score)
    assert set(REWARD_FUNCTIONS) == {"compute_score", "compute_score_flexible",
                                     "compute_score_format"}  # fmt: skip
    assert STRICT("openai/gsm8k", "#### 3", "3")["score"] == 1.0  # positional, extra keywords
    assert FORMAT("x", "#### 3", "3", None, foo=1, bar=None)["score"] == 1.0


def test_only_the_tail_is_read_and_a_cut_token_is_dropped():
    inside = "#### 42\n" + "a" * (TAIL_CHARS - 8)
    assert call(STRICT, inside, "42")["score"] == 1.0 and call(STRICT, inside, "42")["clipped"] == 0
    assert call(STRICT, inside + "a", "42") == dict.fromkeys(rg.KEYS, 0.0) | {"clipped": 1.0}
    cut = call(FLEX, "123456 " + "x" * (TAIL_CHARS - 4), "456")  # the cut falls inside 123456
    assert (cut["pred_found"], cut["clipped"]) == (0.0, 1.0)


# (response, scorers reading it, truths): several values or an expression, never credited
HEDGED = [
    ("#### 7+7", ALL, ["7", "14"]), ("#### 7*7", ALL, ["7", "49"]), ("#### 7x7", ALL, ["7", "49"]),
    ("#### 7 × 7", ALL, ["7"]), ("#### 7-7", ALL, ["7", "0"]), ("#### 7²", ALL, ["7", "49"]),
    ("#### 7^2", ALL, ["7", "49"]), ("#### 2^2", ALL, ["2", "4"]), ("#### 7**2", ALL, ["7"]),
    ("#### 125,96", ALL, ["125", "96"]), (REASONING + "#### 12 or 13", ALL, ["12", "13"]),
    ("#### 12, 13", ALL, ["12"]), ("#### 12 - 13", ALL, ["12", "-13"]),
    ("#### 12–13", ALL, ["12", "13"]), ("#### between 12 and 13", ALL, ["13"]),
    ("#### **12** or **13**", ALL, ["12"]), ("#### 12 (or 13)", ALL, ["12"]),
    ("#### -5 or 5", ALL, ["5"]), ("#### 1 1/2", ALL, ["1", "1.5"]),
    ("#### 1,234, 5,678", ALL, ["1234"]), ("#### 72\n#### 12 or 13", ALL, ["72", "12"]),
    ("\\boxed{12, 13}", FLEXIBLES, ["12"]), ("\\boxed{12 \\text{ or } 13}", FLEXIBLES, ["12"]),
    ("\\boxed{12} then \\boxed{12-13}", FLEXIBLES, ["12"]), ("<answer>7+7</answer>", FLEXIBLES,
    ["7"]), ("So the answer is 12 or 13.", FLEXIBLES, ["12"]),
    ("Final Answer: $1,200 (1,000 per box)", FLEXIBLES, ["1200"]),
    ("#### 12 or 13\n\\boxed{12}", FLEXIBLES, ["12"]), ("\\boxed{7+7}\nanswer is 7", FLEXIBLES,
    ["7"]),
]  # fmt: skip


@pytest.mark.parametrize(("response", "scorers", "truths"), HEDGED)
def test_a_hedge_or_an_expression_scores_zero_whichever_is_right(response, scorers, truths):
    for fn in scorers:
        for truth in truths:
            result = call(fn, response, truth)
            assert (result["score"], result["acc"], result["format"]) == (0, 0, 0), (fn, truth)
            assert (result["hedged"], result["pred_found"]) == (1, 1)


PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ANY = st.one_of(
    st.none(), st.text(max_size=3000), st.integers(), st.floats(), st.binary(max_size=200),
    st.text(alphabet="0123456789.,-+$/#*%{}\\ \nboxedanswer<>:isx^²", max_size=500),
    st.lists(st.text(max_size=20), max_size=5), st.booleans(),
)  # fmt: skip


@PROPERTY
@given(solution=ANY, truth=ANY)
def test_never_raises_and_the_scorers_agree_by_construction(solution, truth):
    strict, flexible, formatted = (call(fn, solution, truth) for fn in ALL)
    assert strict["score"] == strict["acc"] == strict["format"] * strict["acc"]
    assert flexible["acc"] >= strict["acc"] and formatted["acc"] == flexible["acc"]
    assert flexible["format"] == formatted["format"] == strict["format"]
    for result in (strict, flexible, formatted):  # a hedge is found but never right
        assert result["hedged"] <= result["pred_found"] and result["hedged"] * result["acc"] == 0
    assert formatted["score"] == pytest.approx(
        ACC_WEIGHT * formatted["acc"] + FORMAT_WEIGHT * formatted["format"])  # fmt: skip


def decorate(n: int, style: str) -> str:
    sign = "-" if n < 0 else ""
    return {"plain": f"{n}", "commas": f"{n:,}", "dollar": f"{sign}${abs(n):,}", "bold":
            f"**{n:,}**", "decimals": f"{n}.00", "unit": f"{n} dollars", "period": f"{n}.",
            "percent": f"{n}%"}[style]  # fmt: skip


STYLES = ["plain", "commas", "dollar", "bold", "decimals", "unit", "period", "percent"]
NUMBERS = st.integers(min_value=-(10**7), max_value=10**9)


@PROPERTY
@given(prose=st.text(alphabet="abcdefghij ABC.\n=+", max_size=2500), n=NUMBERS, other=NUMBERS,
       style=st.sampled_from(STYLES), space=st.sampled_from(["", " "]),
       explanation=st.text(alphabet="abc 0123456789+=-.,$%*\n", max_size=300))  # fmt: skip
def test_one_stated_number_round_trips_through_every_scorer(prose, n, other, style, space,
                                                            explanation):  # fmt: skip
    response = f"{prose}\n####{space}{decorate(n, style)}\n{explanation}"
    for fn in ALL:
        assert (call(fn, response, f"{n:,}")["score"], call(fn, response, str(n))["hedged"]) == (
            1, 0)  # fmt: skip
    assert call(STRICT, response, str(other))["score"] == (other == n)


@settings(PROPERTY, max_examples=40)  # each example scores 6 texts of up to 4 tails
@given(
    junk=st.text(alphabet="abcxyz#", min_size=TAIL_CHARS, max_size=3 * TAIL_CHARS),
    response=st.text(max_size=TAIL_CHARS // 2),
    truth=st.sampled_from(["72", "-3", "0.5"]),
)
def test_only_the_tail_matters(junk, response, truth):
    for fn in ALL:
        padded = call(fn, junk + "\n" + response, truth)
        assert padded == call(fn, response, truth) | {"clipped": 1.0}


@PROPERTY
@given(a=NUMBERS, b=NUMBERS, styles=st.tuples(*[st.sampled_from(STYLES)] * 2),
       joiner=st.sampled_from([" or ", ", ", " - ", "\u2013", " to ", " and ", " (or ", "; "]),
       place=st.sampled_from(["#### {}", "\\boxed{{{}}}", "<answer>{}</answer>",
                              "The answer is {}."]))  # fmt: skip
def test_two_different_numbers_are_never_credited(a, b, styles, joiner, place):
    b = b if a != b else a + 1
    response = REASONING + place.format(decorate(a, styles[0]) + joiner + decorate(b, styles[1]))
    for fn in ALL if place.startswith("#") else FLEXIBLES:
        for truth in (str(a), str(b), f"{a:,}"):
            assert (call(fn, response, truth)["acc"], call(fn, response, truth)["hedged"]) == (
                0, 1), (fn, response, truth)  # fmt: skip


HOSTILE = [
    "1," * 500_000, "#### " + "9" * 10**6, "9" * 10**6 + " #### " + "9" * 1990,
    "\\boxed{" * 100_000, "\\boxed{" * 250 + "}" * 100, "#### 1" * 300_000, "####" * 300_000,
    "<answer>" * 200_000, "the answer is " * 100_000, "\\frac{" * 300_000,
    " " * 10**6 + "#### 5", "-" * 10**6, ".5" * 500_000, "1/" * 500_000, "1,000" * 200_000,
    "7+" * 500_000, "\x00\ud800" * 100_000, b"#### 5" * 200_000,
]  # fmt: skip


@pytest.mark.parametrize("hostile", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_input_is_fast(hostile):
    for fn in ALL:
        for truth in ("5", hostile):
            start = time.perf_counter()
            call(fn, hostile, truth)
            assert time.perf_counter() - start < 2.0, fn


def test_every_gsm8k_reference_solution_as_verl_scores_it():
    folder, failures, hedged = require_shared("gsm8k"), [], set()
    rows = [json.loads(ln) for name in ("train.jsonl", "test.jsonl")
            for ln in (folder / name).read_text().splitlines() if ln.strip()]  # fmt: skip
    assert len(rows) == 8792
    for index, row in enumerate(rows):
        truth = row["answer"].split("#### ")[-1].strip().replace(",", "")
        head = row["answer"].rpartition("#### ")[0]
        wrong = f"{head}#### {int(truth) - 1}"
        got = [call(fn, row["answer"], truth)["score"] for fn in ALL]
        got += [verl(row["answer"], truth), call(STRICT, wrong, truth)["score"], verl(wrong, truth)]
        if got != [1, 1, 1, 1, 0, 0] or call(FORMAT, wrong, truth)["score"] != FORMAT_WEIGHT:
            failures.append((index, got))
        hedge = f"{head}#### {truth} or {int(truth) + 1}"
        hedged.add((verl(hedge, truth), call(STRICT, hedge, truth)["score"]))
    assert failures == [] and hedged == {(1.0, 0.0)}
    with pytest.raises(TypeError):  # verl's scorer raises on None; ours scores 0
        verl_gsm8k.compute_score(None, "18")


@PROPERTY
@given(
    prose=st.text(alphabet="abcdefghij klmnop=+-*.,\n0123456789", max_size=1500),
    n=NUMBERS,
    other=NUMBERS,
    commas=st.booleans(),
    right=st.booleans(),
    suffix=st.sampled_from(["", "\n", " dollars", "%", " apples in total.\n", "\n\nDone!"]),
)
def test_agrees_with_verl_on_well_formed_answers(prose, n, other, commas, suffix, right):
    response = f"{prose}\n#### {n:,}{suffix}" if commas else f"{prose}\n#### {n}{suffix}"
    truth = str(n if right else other)
    assert call(STRICT, response, truth)["score"] == verl(response, truth)


# verl runs our function

BATCH = [(REASONING + "#### 72", "72"), (PROOF, "1234"), ("It is 70.\n#### 70", "72"),
         ("So the answer is \\boxed{72}.", "72")]  # fmt: skip


def test_verls_reward_loop_worker_runs_our_function(tiny_model_dir):
    """verl's RewardLoopWorker loads each function by path and name; without one, its own."""
    import verl
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from transformers import AutoTokenizer
    from verl.experimental.reward_loop import RewardLoopWorker

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    rows, masks = [], []  # the manager decodes the responses the mask's tail keeps; no prompt
    for response, _ in BATCH:
        ids = tok(response, add_special_tokens=False)["input_ids"]
        assert tok.decode(ids, skip_special_tokens=True) == response
        ids = (ids + [tok.eos_token_id])[:64]
        rows.append(ids + [tok.pad_token_id] * (64 - len(ids)))
        masks.append([1] * len(ids) + [0] * (64 - len(ids)))
    data = DataProto.from_dict(
        tensors={"responses": torch.tensor(rows), "attention_mask": torch.tensor(masks)},
        non_tensors={"data_source": np.array(["openai/gsm8k"] * len(BATCH), dtype=object),
                     "reward_model": np.array([{"style": "rule", "ground_truth": t}
                                               for _, t in BATCH], dtype=object)},
    )  # fmt: skip
    GlobalHydra.instance().clear()
    config_dir = Path(verl.__file__).parent / "trainer" / "config"
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        config = compose("ppo_trainer", [f"actor_rollout_ref.model.path={tiny_model_dir}"])
    custom = config.reward.custom_reward_function

    def scores() -> list[dict]:
        worker = RewardLoopWorker(config)
        return worker.loop.run_until_complete(worker.compute_score_batch(data))

    assert [output["reward_score"] for output in scores()] == [1.0, 0.0, 0.0, 0.0]
    custom.path = str(ROOT / "rewards" / "gsm8k.py")
    for name, fn in REWARD_FUNCTIONS.items():
        custom.name = name
        outputs = scores()
        for output, (response, truth) in zip(outputs, BATCH, strict=True):
            assert output["reward_extra_info"] == fn("gsm8k", response, truth)
            assert output["reward_score"] == output["reward_extra_info"]["score"]
        assert outputs[1]["reward_score"] == 1.0, name  # PROOF: only ours credits it
    custom.name = "compute_score_typo"
    with pytest.raises(AttributeError):
        scores()


CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "48*72"}}\n</tool_call>'


def turns(reply: str, answer: str) -> str:
    """A tool rollout's solution_str as verl decodes it (special tokens dropped): every turn."""
    return f"{CALL}\nuser\n<tool_response>\n{reply}\n</tool_response>\nassistant\n{answer}"


def test_a_multi_turn_response_is_scored_by_its_last_answer_not_the_tools_reply():
    from verl_gsm8k.ppo_trainer.tool_stats import tool_metrics

    right = call(STRICT, turns("3456", "#### 3456"), "3456")
    assert (right["score"], right["tool_calls"], right["tool_errors"]) == (1.0, 1.0, 0.0)
    echoed = call(STRICT, turns("#### 3456", "I am not sure."), "3456")
    assert (echoed["score"], echoed["pred_found"]) == (0.0, 0.0)  # the reply is not an answer
    failed = call(STRICT, turns("error: not arithmetic: x", "#### 1"), "3456")
    assert (failed["score"], failed["tool_calls"], failed["tool_errors"]) == (0.0, 1.0, 1.0)
    plain = call(STRICT, "#### 3456", "3456")
    assert (plain["score"], plain["tool_calls"]) == (1.0, 0.0)
    step = tool_metrics([right, echoed, failed, plain])  # the trainer's per-step metrics
    assert step == {"tools/called": 0.75, "tools/calls": 0.75, "tools/errors": 0.25,
                    "tools/acc_called": 1 / 3, "tools/acc_not_called": 1.0}  # fmt: skip
