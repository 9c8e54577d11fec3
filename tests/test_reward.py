"""Tests of rewards/gsm8k.py on its own (no verl import): tables, properties, hostile input, data.

verl-dependent checks (agreement with verl's built-in scorer, verl's loader and reward managers
calling our function) are in tests/test_reward_verl.py.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest
from helpers import require_shared
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rewards import gsm8k as rg
from rewards.gsm8k import (
    ACC_WEIGHT,
    FORMAT_WEIGHT,
    REWARD_FUNCTIONS,
    TAIL_CHARS,
    compute_score,
    compute_score_flexible,
    compute_score_format,
)

REPO = Path(__file__).resolve().parents[1]
GSM8K_ROWS = {"train.jsonl": 7473, "test.jsonl": 1319}
REQUIRED_KEYS = {"score", "acc", "format", "pred_found", "hedged", "clipped"}


def _call(fn, solution, truth):
    return fn(data_source="openai/gsm8k", solution_str=solution, ground_truth=truth, extra_info={})


def _check_contract(result: object) -> None:
    assert isinstance(result, dict)
    assert set(result) >= REQUIRED_KEYS
    for key, value in result.items():
        assert type(value) in (int, float), (key, value)  # bool / None / str are not metrics
        assert math.isfinite(value), (key, value)
    assert 0.0 <= result["score"] <= 1.0
    for key in REQUIRED_KEYS - {"score"}:
        assert result[key] in (0.0, 1.0), (key, result[key])


REASONING = (
    "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
    "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n"
)

# (response, ground truth, expected compute_score). Each tolerance, then the negative cases.
STRICT_CASES = [
    pytest.param(REASONING + "#### 72", "72", 1.0, id="plain"),
    pytest.param(REASONING + "#### $72", "72", 1.0, id="dollar"),
    pytest.param(REASONING + "#### $ 72", "72", 1.0, id="dollar-space"),
    pytest.param("She earned 0.2 x 50 = $10.\n#### $10.00", "10", 1.0, id="dollar-decimals"),
    pytest.param("Total: 1200 apples.\n#### 1,200", "1200", 1.0, id="thousands-comma"),
    pytest.param("Total: 1200 apples.\n#### 1200", "1,200", 1.0, id="truth-has-comma"),
    pytest.param("#### $1,234,567.00", "1234567", 1.0, id="dollar-commas-decimals"),
    pytest.param(REASONING + "#### 72.", "72", 1.0, id="trailing-period"),
    pytest.param("The discount is 25 percent.\n#### 25%", "25", 1.0, id="percent"),
    pytest.param("#### 18 dollars", "18", 1.0, id="unit-word"),
    pytest.param("#### 5 hours.", "5", 1.0, id="unit-word-period"),
    pytest.param("#### **18**", "18", 1.0, id="bold-number"),
    pytest.param("**#### 18**", "18", 1.0, id="bold-line"),
    pytest.param("**Final answer:**\n#### **$18.00**", "18", 1.0, id="bold-dollar-decimals"),
    pytest.param("So he pays 18.\n####18", "18", 1.0, id="no-space"),
    pytest.param("####     18   \n", "18", 1.0, id="extra-spaces"),
    pytest.param("####\n18", "18", 1.0, id="number-on-next-line"),
    pytest.param("#### 18.00", "18", 1.0, id="decimal-zeros"),
    pytest.param("#### 18.0", "18.00", 1.0, id="decimal-both-sides"),
    pytest.param("#### .5", "0.5", 1.0, id="leading-dot"),
    pytest.param("#### 0.5", ".5", 1.0, id="leading-dot-truth"),
    pytest.param("#### 3/4", "0.75", 1.0, id="fraction"),
    pytest.param("#### 1/2", ".5", 1.0, id="fraction-vs-leading-dot"),
    pytest.param("#### \\frac{3}{4}", "0.75", 1.0, id="latex-frac"),
    pytest.param("#### -5", "-5", 1.0, id="negative"),
    pytest.param("#### $-5", "-5", 1.0, id="negative-dollar"),
    pytest.param("#### -$5", "-5", 1.0, id="minus-dollar"),
    pytest.param("#### \u22125", "-5", 1.0, id="unicode-minus"),
    pytest.param("#### - 5", "-5", 1.0, id="minus-then-space-is-the-sign"),
    pytest.param("#### 12 m^2", "12", 1.0, id="unit-exponent"),
    pytest.param("#### 8 cm^{3}", "8", 1.0, id="unit-exponent-braced"),
    pytest.param("#### The answer is 42", "42", 1.0, id="words-before-number"),
    pytest.param("#### 42\r\n", "42", 1.0, id="crlf"),
    pytest.param("#### 42 ####", "42", 1.0, id="closing-marker"),
    pytest.param("#### Step 1\nadd them\n#### 42", "42", 1.0, id="markdown-heading-before"),
    pytest.param("#### 42\n" + "I checked it twice. " * 60, "42", 1.0, id="marker-1200-from-end"),
    pytest.param("#### 7\n#### 5/0", "7", 1.0, id="zero-denominator-is-no-number"),
    pytest.param("#### 42", 42, 1.0, id="int-truth"),
    pytest.param("#### 42", 42.0, 1.0, id="float-truth"),
    pytest.param("#### 1200", REASONING + "#### 1,200", 1.0, id="truth-is-reference-solution"),
    # negative cases
    pytest.param(REASONING + "#### 71", "72", 0.0, id="wrong-number"),
    pytest.param("#### 72", "720", 0.0, id="72-vs-720"),
    pytest.param("#### 720", "72", 0.0, id="720-vs-72"),
    pytest.param("#### 7.2", "72", 0.0, id="7.2-vs-72"),
    pytest.param("#### 72", "7.2", 0.0, id="72-vs-7.2"),
    pytest.param("#### 72\nWait, that is wrong.\n#### 70", "72", 0.0, id="right-before-last"),
    pytest.param("The answer is 72 ####", "72", 0.0, id="number-only-before-marker"),
    pytest.param(REASONING + "The answer is 72.", "72", 0.0, id="no-marker"),
    pytest.param("\\boxed{72}", "72", 0.0, id="boxed-without-marker"),
    pytest.param("#### seventy-two", "72", 0.0, id="number-in-words"),
    pytest.param("#### 1,2", "12", 0.0, id="comma-not-thousands"),
    pytest.param("#### 1,2", "1", 0.0, id="comma-list-is-hedged"),
    pytest.param("#### 3/4", "3", 0.0, id="fraction-is-not-numerator"),
    pytest.param("#### 5/0", "5", 0.0, id="zero-denominator"),
    pytest.param("#### 1,2345", "1234", 0.0, id="bad-comma-grouping"),
    pytest.param("#### 72\n" + "x " * TAIL_CHARS, "72", 0.0, id="marker-beyond-tail"),
    pytest.param("#### 5", "-5", 0.0, id="sign-matters"),
    pytest.param("#### -5", "5", 0.0, id="sign-matters-truth"),
    pytest.param("#### - 5", "5", 0.0, id="spaced-sign-matters"),
    pytest.param("#### 7^2", "7", 0.0, id="power-is-not-its-base"),
    pytest.param("#### 7^2", "49", 0.0, id="power-is-not-a-stated-value"),
    pytest.param("#### 2^2", "2", 0.0, id="power-of-equal-numbers"),
    pytest.param("#### 72", "", 0.0, id="empty-truth"),
    pytest.param("#### 72", None, 0.0, id="none-truth"),
    pytest.param("", "72", 0.0, id="empty"),
    pytest.param(None, "72", 0.0, id="none"),
]


@pytest.mark.parametrize(("response", "truth", "expected"), STRICT_CASES)
def test_compute_score_table(response, truth, expected):
    result = _call(compute_score, response, truth)
    _check_contract(result)
    assert result["score"] == expected
    assert result["acc"] == expected
    # whenever the marker answer is right, the other two scorers agree it is right
    if expected == 1.0:
        assert _call(compute_score_flexible, response, truth)["score"] == 1.0
        assert _call(compute_score_format, response, truth)["score"] == 1.0


# (response, ground truth, expected compute_score_flexible), including the priority order
# marker > \boxed{} > <answer></answer> > "answer is" > last number.
FLEXIBLE_CASES = [
    pytest.param("So the total is \\boxed{72}.", "72", 1.0, id="boxed"),
    pytest.param("\\boxed{\\$1{,}200}", "1200", 1.0, id="boxed-latex-dollar-comma"),
    pytest.param("\\boxed{\\frac{3}{4}}", "0.75", 1.0, id="boxed-frac"),
    pytest.param("\\boxed{\\text{\\textbf{72}} apples}", "72", 1.0, id="boxed-nested-braces"),
    pytest.param("<answer>72</answer>", "72", 1.0, id="answer-tag"),
    pytest.param("<think>48+24</think>\n<answer>\n $72.00 \n</answer>", "72", 1.0, id="tag-noisy"),
    pytest.param("So the answer is 72.", "72", 1.0, id="answer-is"),
    pytest.param("Final Answer: $1,200\n(1,000 per box)", "1200", 1.0, id="final-answer-colon"),
    pytest.param("THE ANSWER IS 72 apples.", "72", 1.0, id="answer-is-any-case"),
    pytest.param("She sold 48 + 24 = 72", "72", 1.0, id="last-number"),
    pytest.param("#### 72\nCheck: 70 + 2", "72", 1.0, id="marker-beats-last-number"),
    pytest.param("#### 72\nso \\boxed{70}", "72", 1.0, id="marker-beats-boxed"),
    pytest.param("\\boxed{72}. The answer is 70", "72", 1.0, id="boxed-beats-answer-is"),
    pytest.param("<answer>72</answer> in 5 steps", "72", 1.0, id="tag-beats-last-number"),
    pytest.param("The answer is 72.\nCheck: 72 - 2 = 70", "72", 1.0, id="answer-is-beats-last"),
    pytest.param("\\boxed{70} then \\boxed{72}", "72", 1.0, id="last-boxed"),
    pytest.param("\\boxed{72}\n<answer>70</answer>", "72", 1.0, id="boxed-beats-tag"),
    pytest.param("\\boxed{72} and an unclosed \\boxed{70", "70", 1.0, id="unclosed-box-skipped"),
    # negative cases
    pytest.param("\\boxed{70}", "72", 0.0, id="boxed-wrong"),
    pytest.param("#### 70\n\\boxed{72}", "72", 0.0, id="wrong-marker-wins"),
    pytest.param("\\boxed{72}\nThe answer is 70", "70", 0.0, id="answer-is-loses-to-boxed"),
    pytest.param("I do not know.", "72", 0.0, id="no-number"),
    pytest.param("", "72", 0.0, id="empty"),
    pytest.param(None, "72", 0.0, id="none"),
]


@pytest.mark.parametrize(("response", "truth", "expected"), FLEXIBLE_CASES)
def test_compute_score_flexible_table(response, truth, expected):
    result = _call(compute_score_flexible, response, truth)
    _check_contract(result)
    assert result["score"] == expected
    assert result["acc"] == expected


# (response, ground truth, expected acc, expected format) for compute_score_format
FORMAT_CASES = [
    pytest.param(REASONING + "#### 72", "72", 1.0, 1.0, id="right-with-marker"),
    pytest.param(REASONING + "So the answer is \\boxed{72}.", "72", 1.0, 0.0, id="right-no-marker"),
    pytest.param(REASONING + "#### 70", "72", 0.0, 1.0, id="wrong-with-marker"),
    pytest.param("I think it is 70.", "72", 0.0, 0.0, id="wrong-no-marker"),
    pytest.param("#### none", "72", 0.0, 0.0, id="marker-without-number"),
    pytest.param("", "72", 0.0, 0.0, id="empty"),
]


@pytest.mark.parametrize(("response", "truth", "acc", "fmt"), FORMAT_CASES)
def test_compute_score_format_table(response, truth, acc, fmt):
    result = _call(compute_score_format, response, truth)
    _check_contract(result)
    assert (result["acc"], result["format"]) == (acc, fmt)
    assert result["score"] == pytest.approx(ACC_WEIGHT * acc + FORMAT_WEIGHT * fmt)


def test_format_weights_as_documented():
    assert (ACC_WEIGHT, FORMAT_WEIGHT) == (0.8, 0.2)  # docs/reward.md states these numbers
    assert ACC_WEIGHT >= 0.7
    assert abs(ACC_WEIGHT + FORMAT_WEIGHT - 1.0) < 1e-12
    scores = {_call(compute_score_format, case.values[0], "72")["score"] for case in FORMAT_CASES}
    assert sorted(scores) == pytest.approx([0.0, 0.2, 0.8, 1.0])


def test_registry_names_the_public_functions():
    assert set(REWARD_FUNCTIONS) == {
        "compute_score",
        "compute_score_flexible",
        "compute_score_format",
    }
    for name, fn in REWARD_FUNCTIONS.items():
        assert getattr(rg, name) is fn


def test_positional_call_and_extra_kwargs():
    # verl passes keywords, and may add reward_kwargs; positional use must work too
    assert compute_score("openai/gsm8k", "#### 3", "3")["score"] == 1.0
    assert compute_score_format("x", "#### 3", "3", None, foo=1, bar=None)["score"] == 1.0


def test_tail_is_read_and_clipped_flag():
    answer = "#### 42\n"
    inside = answer + "a" * (TAIL_CHARS - len(answer))  # exactly TAIL_CHARS long
    assert _call(compute_score, inside, "42")["clipped"] == 0.0
    assert _call(compute_score, inside, "42")["score"] == 1.0
    outside = answer + "a" * (TAIL_CHARS - len(answer) + 1)  # one char too many: marker cut off
    assert _call(compute_score, outside, "42") == {
        "score": 0.0,
        "acc": 0.0,
        "format": 0.0,
        "pred_found": 0.0,
        "hedged": 0.0,
        "clipped": 1.0,
    }


def test_cut_does_not_leave_half_a_number():
    # the cut falls inside "123456": the flexible scorer must not read its tail "456" as a number
    text = "123456 " + "x" * (TAIL_CHARS - 4)
    assert len(text) > TAIL_CHARS
    result = _call(compute_score_flexible, text, "456")
    assert (result["pred_found"], result["clipped"]) == (0.0, 1.0)


# ---------------------------------------------------------------- hedged answers

# (response, scorers that must reject it, truths to try): the answer segment offers several
# candidate numbers, so it scores 0 whichever of them is right (before, the first one scored 1).
STRICT = ("compute_score", "compute_score_flexible", "compute_score_format")
FLEXIBLE = ("compute_score_flexible", "compute_score_format")
HEDGED_CASES = [
    pytest.param("#### 125,96", STRICT, ["125", "96", "12596"], id="bad-thousands-group"),
    pytest.param(REASONING + "#### 12 or 13", STRICT, ["12", "13"], id="or"),
    pytest.param("#### 1,2,3,4,5", STRICT, ["1", "5", "12345"], id="comma-list"),
    pytest.param("#### 12, 13", STRICT, ["12", "13"], id="comma-space-list"),
    pytest.param("#### 12-13", STRICT, ["12", "13"], id="range-hyphen"),
    pytest.param("#### 12 - 13", STRICT, ["12", "13", "-13"], id="range-spaced"),
    pytest.param("#### 12–13", STRICT, ["12", "13"], id="range-en-dash"),
    pytest.param("#### between 12 and 13", STRICT, ["12", "13"], id="between"),
    pytest.param("#### 5 apples and 6 pears", STRICT, ["5", "6", "11"], id="two-quantities"),
    pytest.param("#### $12 or $13", STRICT, ["12", "13"], id="dollars"),
    pytest.param("#### **12** or **13**", STRICT, ["12", "13"], id="bold"),
    pytest.param("#### 12 (or 13)", STRICT, ["12", "13"], id="parenthesis"),
    pytest.param("#### 3.5 or 4", STRICT, ["3.5", "4"], id="decimal-or-integer"),
    pytest.param("#### -5 or 5", STRICT, ["-5", "5"], id="signs"),
    pytest.param("#### 1 1/2", STRICT, ["1", "0.5", "1.5"], id="mixed-number"),
    pytest.param("#### 1,234, 5,678", STRICT, ["1234", "5678"], id="two-thousands"),
    pytest.param("#### 72\n#### 12 or 13", STRICT, ["72", "12"], id="last-marker-not-skipped"),
    pytest.param("\\boxed{12, 13}", FLEXIBLE, ["12", "13"], id="boxed-list"),
    pytest.param("\\boxed{12 \\text{ or } 13}", FLEXIBLE, ["12", "13"], id="boxed-or"),
    pytest.param("\\boxed{12} then \\boxed{12-13}", FLEXIBLE, ["12"], id="last-box-hedged"),
    pytest.param("<answer>12 or 13</answer>", FLEXIBLE, ["12", "13"], id="tag"),
    pytest.param("So the answer is 12 or 13.", FLEXIBLE, ["12", "13"], id="answer-is"),
    pytest.param("THE ANSWER IS 72 apples, 5 each", FLEXIBLE, ["72", "5"], id="answer-is-two"),
    pytest.param("Final Answer: $1,200 (1,000 per box)", FLEXIBLE, ["1200"], id="answer-colon"),
    pytest.param("#### 12 or 13\n\\boxed{12}", FLEXIBLE, ["12"], id="marker-not-passed-over"),
    pytest.param("\\boxed{12 or 13}\nThe answer is 12", FLEXIBLE, ["12"], id="box-not-passed"),
]


@pytest.mark.parametrize(("response", "names", "truths"), HEDGED_CASES)
def test_hedged_answer_scores_zero_whichever_is_right(response, names, truths):
    for name in names:
        for truth in truths:
            result = _call(REWARD_FUNCTIONS[name], response, truth)
            _check_contract(result)
            assert (result["score"], result["acc"]) == (0.0, 0.0), (name, truth)
            assert (result["hedged"], result["pred_found"], result["format"]) == (1.0, 1.0, 0.0)


# (response, ground truth): formatting noise around ONE number is still credited by every scorer
SINGLE_CANDIDATE_CASES = [
    pytest.param("#### 1,234,567", "1234567", id="thousands-groups"),
    pytest.param("#### -1,234", "-1234", id="negative-thousands"),
    pytest.param("#### -5", "-5", id="negative-is-not-a-range"),
    pytest.param("#### -2.5", "-2.5", id="negative-decimal"),
    pytest.param("#### 0.25", "0.25", id="decimal-is-one-number"),
    pytest.param("#### 3/4", "0.75", id="fraction-is-one-number"),
    pytest.param("#### \\dfrac{3}{4}", "0.75", id="latex-fraction"),
    pytest.param("#### $1,200.00 per month", "1200", id="currency-and-unit"),
    pytest.param("#### 15% of them", "15", id="percent-and-words"),
    pytest.param("#### 18 m^2", "18", id="unit-exponent"),
    pytest.param("#### 18 cm^{3}", "18", id="unit-exponent-braces"),
    pytest.param("#### 72 (72 clips)", "72", id="same-value-twice"),
    pytest.param("#### 3/4 = 0.75", "0.75", id="same-value-two-ways"),
    pytest.param("#### **$18.00**", "18", id="bold-currency"),
    pytest.param(
        "#### 72\nBecause 48 + 24 = 72, not 70 or 71.\nDone in 2 steps.",
        "72",
        id="explanation-on-following-lines",
    ),
    pytest.param("####\n72\nthat is 70 + 2", "72", id="number-on-next-line-then-explanation"),
]


@pytest.mark.parametrize(("response", "truth"), SINGLE_CANDIDATE_CASES)
def test_single_candidate_with_noise_is_credited(response, truth):
    for fn in REWARD_FUNCTIONS.values():
        result = _call(fn, response, truth)
        assert (result["score"], result["acc"], result["hedged"]) == (1.0, 1.0, 0.0), fn


# ---------------------------------------------------------------- properties (hypothesis)

ANY_VALUE = st.one_of(
    st.none(),
    st.text(max_size=3000),
    st.text(alphabet="0123456789.,-+$/#*%{}\\ \nboxedanswer<>:is", max_size=500),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.binary(max_size=200),
    st.lists(st.text(max_size=20), max_size=5),
    st.booleans(),
)
PROPERTY_SETTINGS = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


@PROPERTY_SETTINGS
@given(solution=ANY_VALUE, truth=ANY_VALUE)
def test_never_raises_and_returns_numeric_metrics(solution, truth):
    strict = _call(compute_score, solution, truth)
    flexible = _call(compute_score_flexible, solution, truth)
    formatted = _call(compute_score_format, solution, truth)
    for result in (strict, flexible, formatted):
        _check_contract(result)
    # relations that hold by construction of the three scorers
    assert strict["score"] == strict["acc"] == strict["format"] * strict["acc"]
    assert flexible["acc"] >= strict["acc"]
    assert flexible["format"] == formatted["format"] == strict["format"]
    assert formatted["acc"] == flexible["acc"]
    for result in (strict, flexible, formatted):  # a hedged answer is found but never right
        assert result["hedged"] <= result["pred_found"]
        assert result["hedged"] * result["acc"] == 0.0
    assert strict["hedged"] * strict["format"] == 0.0
    assert formatted["score"] == pytest.approx(
        ACC_WEIGHT * formatted["acc"] + FORMAT_WEIGHT * formatted["format"]
    )


def _decorate(n: int, style: str) -> str:
    sign, magnitude = ("-" if n < 0 else ""), abs(n)
    return {
        "plain": f"{n}",
        "commas": f"{n:,}",
        "dollar": f"{sign}${magnitude:,}",
        "decimals": f"{n}.00",
        "bold": f"**{n:,}**",
        "unit": f"{n} dollars",
        "period": f"{n}.",
        "percent": f"{n}%",
        "nospace": f"{n}",
    }[style]


STYLES = ["plain", "commas", "dollar", "decimals", "bold", "unit", "period", "percent", "nospace"]
PROSE = st.text(alphabet="abcdefghijklmnopqrstuvwxyz ABC.\n=+", max_size=2500)


@PROPERTY_SETTINGS
@given(
    prose=PROSE,
    n=st.integers(min_value=-(10**7), max_value=10**9),
    other=st.integers(min_value=-(10**7), max_value=10**9),
    style=st.sampled_from(STYLES),
    truth_commas=st.booleans(),
)
def test_marker_round_trip(prose, n, other, style, truth_commas):
    marker = "####" if style == "nospace" else "#### "
    response = f"{prose}\n{marker}{_decorate(n, style)}\n"
    truth = f"{n:,}" if truth_commas else str(n)
    for fn in REWARD_FUNCTIONS.values():
        assert _call(fn, response, truth)["score"] == 1.0
    expected = 1.0 if other == n else 0.0
    assert _call(compute_score, response, str(other))["score"] == expected


JOINERS = [
    " or ",
    ", ",
    " - ",
    "\u2013",
    " to ",
    " and ",
    " (or ",
    "; ",
    " apples and ",
    " or maybe ",
]
PLACES = {  # where the answer segment is, and the scorers that read it there
    "#### {}": STRICT,
    "\\boxed{{{}}}": FLEXIBLE,
    "<answer>{}</answer>": FLEXIBLE,
    "The answer is {}.": FLEXIBLE,
}


@PROPERTY_SETTINGS
@given(
    a=st.integers(min_value=-(10**7), max_value=10**9),
    b=st.integers(min_value=-(10**7), max_value=10**9),
    styles=st.tuples(st.sampled_from(STYLES), st.sampled_from(STYLES)),
    joiner=st.sampled_from(JOINERS),
    place=st.sampled_from(sorted(PLACES)),
)
def test_two_different_candidates_are_never_credited(a, b, styles, joiner, place):
    if a == b:
        b = a + 1
    segment = _decorate(a, styles[0]) + joiner + _decorate(b, styles[1])
    response = REASONING + place.format(segment)
    for name in PLACES[place]:
        for truth in (str(a), str(b), f"{a:,}"):
            result = _call(REWARD_FUNCTIONS[name], response, truth)
            assert (result["acc"], result["hedged"]) == (0.0, 1.0), (name, response, truth)


@PROPERTY_SETTINGS
@given(
    n=st.integers(min_value=-(10**7), max_value=10**9),
    style=st.sampled_from(STYLES),
    explanation=st.text(alphabet="abc 0123456789+=-.,$%*\n", max_size=300),
)
def test_one_candidate_then_explanation_lines_is_credited(n, style, explanation):
    response = f"{REASONING}#### {_decorate(n, style)}\n{explanation}"
    for fn in REWARD_FUNCTIONS.values():
        result = _call(fn, response, str(n))
        assert (result["score"], result["hedged"]) == (1.0, 0.0), (fn, response)


@PROPERTY_SETTINGS
@given(
    junk=st.text(alphabet="abcxyz#", min_size=TAIL_CHARS, max_size=3 * TAIL_CHARS),
    response=st.text(max_size=TAIL_CHARS // 2),
    truth=st.sampled_from(["72", "-3", "0.5"]),
)
def test_only_the_tail_matters(junk, response, truth):
    # anything before the last TAIL_CHARS characters (cut at a whitespace) is ignored
    for fn in REWARD_FUNCTIONS.values():
        short, padded = _call(fn, response, truth), _call(fn, junk + "\n" + response, truth)
        assert padded["clipped"] == 1.0
        assert {k: v for k, v in short.items() if k != "clipped"} == {
            k: v for k, v in padded.items() if k != "clipped"
        }


HOSTILE = [
    pytest.param("1," * 500_000, id="commas"),
    pytest.param("#### " + "9" * 10**6, id="marker-then-million-digits"),
    pytest.param("9" * 10**6 + " #### " + "9" * 1990, id="huge-number-in-tail"),
    pytest.param("\\boxed{" * 100_000, id="nested-boxed"),
    pytest.param("\\boxed{" * 250 + "}" * 100, id="nested-boxed-in-tail"),
    pytest.param("#### 1" * 300_000, id="many-markers"),
    pytest.param("####" * 300_000, id="many-empty-markers"),
    pytest.param("<answer>" * 200_000, id="open-tags"),
    pytest.param("the answer is " * 100_000, id="answer-is-repeated"),
    pytest.param("\\frac{" * 300_000, id="open-fracs"),
    pytest.param(" " * 10**6 + "#### 5", id="spaces"),
    pytest.param("-" * 10**6, id="minus-signs"),
    pytest.param(".5" * 500_000, id="dots"),
    pytest.param("1/" * 500_000, id="slashes"),
    pytest.param("1,000" * 200_000, id="comma-groups"),
    pytest.param("\x00\ud800" * 100_000, id="nul-and-lone-surrogate"),
    pytest.param(b"#### 5" * 200_000, id="bytes"),
]


@pytest.mark.parametrize("hostile", HOSTILE)
def test_hostile_input_is_fast(hostile):
    for fn in REWARD_FUNCTIONS.values():
        for truth in ("5", hostile):  # hostile ground truths as well
            start = time.perf_counter()
            result = _call(fn, hostile, truth)
            elapsed = time.perf_counter() - start
            _check_contract(result)
            assert elapsed < 2.0, (fn.__name__, elapsed)


# ---------------------------------------------------------------- the real GSM8K data


def _gsm8k_rows() -> list[dict]:
    folder = require_shared("gsm8k")
    rows = []
    for name, count in GSM8K_ROWS.items():
        with open(folder / name, encoding="utf-8") as handle:
            part = [json.loads(line) for line in handle if line.strip()]
        assert len(part) == count, name
        rows.extend(part)
    return rows


def _reference_truth(answer: str) -> str:
    """What verl's own GSM8K prep stores as ground truth: after '#### ', commas removed."""
    return answer.split("#### ")[-1].strip().replace(",", "")


def test_every_reference_solution_is_credited():
    rows = _gsm8k_rows()
    assert len(rows) == 8792
    failures = []
    for index, row in enumerate(rows):
        truth = _reference_truth(row["answer"])
        for fn in REWARD_FUNCTIONS.values():
            result = _call(fn, row["answer"], truth)
            if (result["score"], result["hedged"]) != (1.0, 0.0):
                failures.append((index, fn.__name__, row["answer"][-60:], truth))
    assert failures == []


def test_every_reference_solution_with_a_changed_answer_is_rejected():
    failures = []
    for index, row in enumerate(_gsm8k_rows()):
        truth = _reference_truth(row["answer"])
        head, _, _ = row["answer"].rpartition("#### ")
        wrong = f"{head}#### {int(truth) + 1}"  # every GSM8K answer is an integer
        if _call(compute_score, wrong, truth)["score"] != 0.0:
            failures.append((index, wrong[-40:], truth))
        if _call(compute_score_format, wrong, truth)["score"] != pytest.approx(FORMAT_WEIGHT):
            failures.append((index, "format", wrong[-40:], truth))
    assert failures == []
