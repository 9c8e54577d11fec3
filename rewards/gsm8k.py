"""GSM8K reward functions for verl 0.9.1 (standard library only).

verl loads this file by path and calls one of its functions in every reward worker::

    reward.custom_reward_function.path=<repo>/rewards/gsm8k.py
    reward.custom_reward_function.name=compute_score   # or any key of REWARD_FUNCTIONS

with keywords ``(data_source=..., solution_str=..., ground_truth=..., extra_info=..., **kwargs)``.
``solution_str`` is the decoded response, ``ground_truth`` the row's ``reward_model.ground_truth``
(e.g. ``"72"`` or ``"1,200"``); ``data_source``, ``extra_info`` and extra keywords are ignored.

Contract shared by every scorer in ``REWARD_FUNCTIONS``:

* It returns ``{"score", "acc", "format", "pred_found", "hedged", "clipped"}``, every value a
  float, so that verl can average each key into validation metrics
  (``val-core/<data_source>/acc/mean@N``). ``score`` is the reward, in [0, 1]; ``acc`` is 1.0
  when the extracted answer equals the ground truth; ``format`` is 1.0 when a ``####`` marker
  followed by one number is present; ``pred_found`` is 1.0 when the scorer extracted any
  answer; ``hedged`` is 1.0 when that answer offered several candidate numbers (never credited,
  below); ``clipped`` is 1.0 when the response was longer than ``TAIL_CHARS`` and only its tail
  was read.
* It never raises, whatever it is given (None, non-strings, megabytes of text), and its time is
  bounded: only the last ``TAIL_CHARS`` characters are read, answer segments are cut to
  ``ANSWER_WINDOW`` characters, and no regular expression here can backtrack catastrophically.
* Numbers are compared exactly with ``fractions.Fraction`` (never ``eval`` or floats), after
  removing the noise models put around them: ``$``, thousands commas, markdown ``**``, LaTeX
  ``\\frac{a}{b}``, a trailing period, ``%`` or unit word. So ``18``, ``18.00``, ``$18.``,
  ``**18**`` all equal ``18``; ``.5``, ``0.5`` and ``1/2`` are equal; ``1,234`` is ``1234``.
* A hedged answer is never credited: when the answer segment (the marker's line, a box's or a
  tag's content, the line after "answer is") holds numbers of more than one value, as in
  ``12 or 13``, ``1,2,3``, ``12-13`` or ``5 apples and 6 pears``, it scores 0 whichever is right,
  and the scorer does not fall back to an earlier marker or another extractor. ``-5``, ``2.5``,
  ``- 5``, ``3/4``, ``1,234,567``, a unit's exponent (``m^2``) and the same value twice are one
  candidate; a power of a number (``7^2``) is an expression, not a stated value, and scores 0
  like a hedge; an explanation on the following lines is not part of the segment.

Scorers:

* ``compute_score`` (training default): the number on the line of the last ``####`` marker that
  has one. A response without such a marker scores 0: that format is what the prompt asks for.
* ``compute_score_flexible`` (evaluating other prompts): the first of, in priority order,
  1. the ``####`` marker answer, 2. the last ``\\boxed{...}`` (nested braces allowed),
  3. the last ``<answer>...</answer>``, 4. the last "answer is ..." / "answer: ...",
  5. the last number in the tail.
* ``compute_score_format``: ``ACC_WEIGHT * acc + FORMAT_WEIGHT * format``, with ``acc`` judged
  as in ``compute_score_flexible`` and ``format`` as above: 1.0, 0.8 (right but no marker),
  0.2 (marker but wrong) or 0.0 (a hedged marker answer scores 0.0, below a wrong one).
"""

import re
from collections.abc import Callable
from fractions import Fraction
from functools import lru_cache
from typing import Any

TAIL_CHARS = 2000  # only this many trailing characters of a response are read (verl's: 300)
ANSWER_WINDOW = 100  # an answer segment (after a marker, in a box, ...) is cut to this length
ACC_WEIGHT = 0.8  # compute_score_format: weight of correctness (keep >= 0.7)
FORMAT_WEIGHT = 0.2  # compute_score_format: weight of the "#### <number>" format
MARKER = "####"

# A number: optional sign (not glued to a word, as in "x-5"; one space may follow it: "- 5" is
# -5), then "1,234" (groups of three only), "18", "18.00" or ".5", then an optional "/ 4"
# denominator. No nested quantifiers.
_NUMBER_RE = re.compile(
    r"(?:(?<![0-9A-Za-z])(?P<neg>-) ?)?"
    r"(?P<num>(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?|\.\d+)"
    r"(?:\s?/\s?(?P<den>\d+))?"
)
# A unit's exponent ("m^2", "cm^{3}": right after a letter), removed before counting an answer's
# numbers; a number's power ("7^2", "10 ^ 3") is an expression, not one stated value.
_EXPONENT_RE = re.compile(r"(?<=[A-Za-z])\^\{?\d+\}?")
_POWER_RE = re.compile(r"[0-9)}]\s?\^")
_LATEX_FRAC_RE = re.compile(r"\\[dt]?frac\s?\{([^{}]*)\}\s?\{([^{}]*)\}")
_ANSWER_IS_RE = re.compile(r"answer\s*(?:is|:|=)", re.IGNORECASE)
_SPACE_RE = re.compile(r"\s")
_BOX_OPEN = "\\boxed{"
_TAG_OPEN, _TAG_CLOSE = "<answer>", "</answer>"


def _tail(value: Any) -> tuple[str, bool]:
    """The last TAIL_CHARS characters of ``value`` as text, and whether anything was cut off."""
    if isinstance(value, str):
        text = value
    elif isinstance(value, (bytes, bytearray)):
        text = bytes(value[-4 * TAIL_CHARS :]).decode("utf-8", "replace")
    elif value is None:
        text = ""
    else:
        text = str(value)
    if len(text) <= TAIL_CHARS:
        return text, False
    tail = text[-TAIL_CHARS:]
    space = _SPACE_RE.search(tail)  # drop the token that the cut split in two
    return (tail[space.end() :] if space else ""), True


def _clean(text: str) -> str:
    """Remove formatting noise that would hide a number from _NUMBER_RE."""
    text = text.replace("{,}", ",").replace("\u2212", "-").replace("$", "")
    return _LATEX_FRAC_RE.sub(r"\1/\2", text) if "frac" in text else text


def _to_fraction(match: "re.Match[str]") -> Fraction | None:
    digits = match["num"].replace(",", "")
    value = Fraction(digits) if "." in digits else Fraction(int(digits))
    if match["den"] is not None:
        denominator = int(match["den"])
        if denominator == 0:
            return None
        value /= denominator
    return -value if match["neg"] else value


def _first_number(text: str) -> Fraction | None:
    match = _NUMBER_RE.search(_clean(text[:ANSWER_WINDOW]))
    return _to_fraction(match) if match else None


class _Hedged:
    """An answer segment that offers more than one candidate number: never credited."""


HEDGED = _Hedged()
Answer = Fraction | _Hedged | None  # None: the segment holds no number


def _answer(segment: str) -> Answer:
    """The one number ``segment`` offers, HEDGED if it offers several values, None if none.

    A list, alternatives, a range or several quantities (``12 or 13``, ``1,2,3``, ``12-13``,
    ``5 apples and 6 pears``) are several candidates; the same value written twice
    (``72 (72 clips)``) and a unit's exponent (``m^2``) are not.
    """
    text = _EXPONENT_RE.sub("", _clean(segment[:ANSWER_WINDOW]))
    values = {_to_fraction(match) for match in _NUMBER_RE.finditer(text)}
    if len(values) > 1 or (values and _POWER_RE.search(text)):
        return HEDGED
    return values.pop() if values else None  # a lone "5/0" is no number


def _last_number(text: str) -> Fraction | None:
    last = None
    for last in _NUMBER_RE.finditer(_clean(text)):  # noqa: B007 (we want the final match)
        pass
    return _to_fraction(last) if last else None


def _segment(text: str, start: int, end: int) -> str:
    """The first line of ``text[start:end]`` after leading whitespace, at most ANSWER_WINDOW."""
    return text[start:end].lstrip()[:ANSWER_WINDOW].split("\n", 1)[0]


def _marker_answer(tail: str) -> Answer:
    """The answer on the line of the last ``####`` that is followed by a number."""
    end = len(tail)
    while (start := tail.rfind(MARKER, 0, end)) >= 0:
        answer = _answer(_segment(tail, start + len(MARKER), end))
        if answer is not None:
            return answer
        end = start
    return None


def _boxed_answer(tail: str) -> Answer:
    start = tail.rfind(_BOX_OPEN)
    if start < 0:
        return None
    start += len(_BOX_OPEN)
    depth = 0
    for pos in range(start, len(tail)):
        char = tail[pos]
        if char == "{":
            depth += 1
        elif char == "}":
            if depth == 0:
                return _answer(tail[start:pos].strip())
            depth -= 1
    return None  # unbalanced: not a box


def _tag_answer(tail: str) -> Answer:
    start = tail.rfind(_TAG_OPEN)
    end = tail.find(_TAG_CLOSE, start) if start >= 0 else -1
    return _answer(tail[start + len(_TAG_OPEN) : end].strip()) if end >= 0 else None


def _answer_is_answer(tail: str) -> Answer:
    last = None
    for last in _ANSWER_IS_RE.finditer(tail):  # noqa: B007 (we want the final match)
        pass
    return _answer(_segment(tail, last.end(), len(tail))) if last else None


def _flexible_answer(tail: str) -> Answer:
    """The first extractor that finds an answer decides; a hedged one is not passed over."""
    for extract in (_marker_answer, _boxed_answer, _tag_answer, _answer_is_answer, _last_number):
        answer = extract(tail)
        if answer is not None:
            return answer
    return None


def _ground_truth(value: Any) -> Fraction | None:
    """``"72"``, ``"1,200"``, ``72``, ``72.0`` or a whole reference solution ending ``#### 72``."""
    if type(value) is str and len(value) <= ANSWER_WINDOW:
        return _short_ground_truth(value)  # the usual case, cached: GRPO repeats each truth n times
    return _parse_ground_truth(value)


@lru_cache(maxsize=4096)
def _short_ground_truth(value: str) -> Fraction | None:
    return _parse_ground_truth(value)


def _parse_ground_truth(value: Any) -> Fraction | None:
    text, _ = _tail(value)
    if MARKER in text:
        text = text[text.rfind(MARKER) + len(MARKER) :]
    return _first_number(text.strip())


def _score(
    solution_str: Any, ground_truth: Any, flexible: bool, acc_weight: float, format_weight: float
) -> dict[str, float]:
    try:
        tail, clipped = _tail(solution_str)
        marker = _marker_answer(tail)
        pred = _flexible_answer(tail) if flexible and marker is None else marker
        truth = _ground_truth(ground_truth)
        acc = 1.0 if isinstance(pred, Fraction) and pred == truth else 0.0
        fmt = 1.0 if isinstance(marker, Fraction) else 0.0
        return {
            "score": acc_weight * acc + format_weight * fmt,
            "acc": acc,
            "format": fmt,
            "pred_found": 1.0 if pred is not None else 0.0,
            "hedged": 1.0 if pred is HEDGED else 0.0,
            "clipped": 1.0 if clipped else 0.0,
        }
    except Exception:  # a reward worker must never crash on a model output
        return dict.fromkeys(("score", "acc", "format", "pred_found", "hedged", "clipped"), 0.0)


def compute_score(
    data_source: Any, solution_str: Any, ground_truth: Any, extra_info: Any = None, **kwargs: Any
) -> dict[str, float]:
    """1.0 when the number after the last ``####`` marker equals the ground truth, else 0.0."""
    return _score(solution_str, ground_truth, flexible=False, acc_weight=1.0, format_weight=0.0)


def compute_score_flexible(
    data_source: Any, solution_str: Any, ground_truth: Any, extra_info: Any = None, **kwargs: Any
) -> dict[str, float]:
    """Like compute_score, falling back to boxed / <answer> / "answer is" / last number."""
    return _score(solution_str, ground_truth, flexible=True, acc_weight=1.0, format_weight=0.0)


def compute_score_format(
    data_source: Any, solution_str: Any, ground_truth: Any, extra_info: Any = None, **kwargs: Any
) -> dict[str, float]:
    """ACC_WEIGHT * flexible accuracy + FORMAT_WEIGHT * (a ``#### <number>`` marker is present)."""
    return _score(
        solution_str,
        ground_truth,
        flexible=True,
        acc_weight=ACC_WEIGHT,
        format_weight=FORMAT_WEIGHT,
    )


assert ACC_WEIGHT >= 0.7 and ACC_WEIGHT + FORMAT_WEIGHT == 1.0

REWARD_FUNCTIONS: dict[str, Callable[..., dict[str, float]]] = {
    "compute_score": compute_score,
    "compute_score_flexible": compute_score_flexible,
    "compute_score_format": compute_score_format,
}
