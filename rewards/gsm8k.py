"""GSM8K reward functions for verl 0.9.1, standard library only (docs/reward.md).

verl loads this file by path (``reward.custom_reward_function.path``/``.name``) and calls a
function of ``REWARD_FUNCTIONS`` with ``data_source``, ``solution_str`` (the response),
``ground_truth`` (``"72"``, ``"1,200"``, a number or a solution ending ``#### 72``),
``extra_info`` and extra keywords, all but the response and the truth ignored.

A multi-turn response (verl's agent loop with a tool, docs/tools.md) holds every turn: the model's
tool calls, the tool's replies (``<tool_response>...</tool_response>``) and its last answer. Only
the text after the last tool reply is the model's answer; the replies are never read as one.

Each returns floats ``score``, ``acc``, ``format`` (a ``####`` line with one number),
``pred_found``, ``hedged``, ``clipped`` (only the last ``TAIL_CHARS`` were read), ``tool_calls``
(the ``<tool_call>`` blocks the model wrote) and ``tool_errors`` (the replies that were an error).
It never raises and its time is bounded: a tail of the answer, answer segments of ``ANSWER_WINDOW``
characters, no regular expression that backtracks. Numbers compare exactly as fractions after the
noise around them goes (``$``, thousands commas, ``**``, ``\\frac``, a period, ``%``, a unit word):
``18.00``, ``$18.`` and ``**18**`` are ``18``; ``.5`` and ``1/2`` are equal.
An answer segment (the marker's line, a box, a tag, what follows "answer is") that offers several
values (``12 or 13``, ``1,2,3``, ``12-13``) or an expression (``7+7``, ``7x7``, ``7^2``, ``7²``) is
hedged: it scores 0 whichever value is right, and no other segment is read.

* ``compute_score``: the number on the line of the last ``####`` that has one; none: 0.
* ``compute_score_flexible``: else the last ``\\boxed{}``, ``<answer>``, "answer is ...", then
  the last number.
* ``compute_score_format``: ``ACC_WEIGHT`` x flexible accuracy + ``FORMAT_WEIGHT`` x format.
"""

import re
from collections.abc import Callable
from fractions import Fraction
from functools import lru_cache
from typing import Any

TAIL_CHARS = 2000  # trailing characters of a response read (verl's built-in scorer: 300)
ANSWER_WINDOW = 100  # longest answer segment read
ACC_WEIGHT, FORMAT_WEIGHT = 0.8, 0.2  # compute_score_format (ACC_WEIGHT kept >= 0.7)
MARKER = "####"
KEYS = ("score", "acc", "format", "pred_found", "hedged", "clipped", "tool_calls", "tool_errors")
CALL, REPLY, REPLY_END = "<tool_call>", "<tool_response>", "</tool_response>"
# How a tool reply that is an error starts: the calculator's, then verl's agent loop's own
# (an unknown tool, arguments that are not JSON, a tool that raised).
ERRORS = ("error:", "Unknown function", "Invalid JSON", "Error executing tool")

# A number: a sign not glued to a word ("- 5" is -5), "1,234" (groups of three), "18", "18.00"
# or ".5", then an optional "/ 4". No nested quantifiers.
_NUMBER_RE = re.compile(
    r"(?:(?<![0-9A-Za-z])(?P<neg>-) ?)?"
    r"(?P<num>(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?|\.\d+)"
    r"(?:\s?/\s?(?P<den>\d+))?"
)
_EXPONENT_RE = re.compile(r"(?<=[A-Za-z])\^\{?\d+\}?")  # a unit's ("m^2"), removed first
# An operator between two numbers or a power after one: an expression, not a stated value.
_EXPRESSION_RE = re.compile(r"[0-9)}]\s?(?:[-+*x×·÷–]\*?\s?[0-9.(]|\^|[²³¹⁰⁴-⁹])")
_FRAC_RE = re.compile(r"\\[dt]?frac\s?\{([^{}]*)\}\s?\{([^{}]*)\}")
_ANSWER_IS_RE = re.compile(r"answer\s*(?:is|:|=)", re.IGNORECASE)
_SPACE_RE = re.compile(r"\s")
_BOX, _TAG, _TAG_END = "\\boxed{", "<answer>", "</answer>"


class _Hedged:
    """A segment offering several values, or an expression: never credited."""


HEDGED = _Hedged()
Answer = Fraction | _Hedged | None  # None: no number


def _tail(value: Any) -> tuple[str, bool]:
    """The last TAIL_CHARS characters of ``value`` as text (without the token the cut split),
    and whether anything was cut."""
    if isinstance(value, bytes | bytearray):
        value = bytes(value[-4 * TAIL_CHARS :]).decode("utf-8", "replace")
    text = "" if value is None else value if isinstance(value, str) else str(value)
    if len(text) <= TAIL_CHARS:
        return text, False
    space = _SPACE_RE.search(text[-TAIL_CHARS:])
    return (text[-TAIL_CHARS:][space.end() :] if space else ""), True


def _clean(text: str) -> str:
    text = text.replace("{,}", ",").replace("\u2212", "-").replace("$", "")
    return _FRAC_RE.sub(r"\1/\2", text) if "frac" in text else text


def _value(match: "re.Match[str]") -> Fraction | None:
    digits = match["num"].replace(",", "")
    value = Fraction(digits) if "." in digits else Fraction(int(digits))
    if match["den"] is not None:
        if int(match["den"]) == 0:
            return None
        value /= int(match["den"])
    return -value if match["neg"] else value


def _answer(segment: str) -> Answer:
    """The one value ``segment`` states; HEDGED for several values or an expression."""
    text = _EXPONENT_RE.sub("", _clean(segment[:ANSWER_WINDOW]))
    values = {_value(match) for match in _NUMBER_RE.finditer(text)}
    if len(values) > 1 or (values and _EXPRESSION_RE.search(text)):
        return HEDGED
    return values.pop() if values else None  # a lone "5/0" is no number


def _line(text: str, start: int, end: int) -> str:
    return text[start:end].lstrip()[:ANSWER_WINDOW].split("\n", 1)[0]


def _marker_answer(tail: str) -> Answer:
    """The answer on the line of the last ``####`` followed by a number."""
    end = len(tail)
    while (start := tail.rfind(MARKER, 0, end)) >= 0:
        answer = _answer(_line(tail, start + len(MARKER), end))
        if answer is not None:
            return answer
        end = start
    return None


def _boxed_answer(tail: str) -> Answer:
    start = tail.rfind(_BOX)
    depth = 0
    for pos in range(start + len(_BOX), len(tail)) if start >= 0 else ():
        if tail[pos] == "{":
            depth += 1
        elif tail[pos] == "}":
            if depth == 0:
                return _answer(tail[start + len(_BOX) : pos].strip())
            depth -= 1
    return None  # no box, or an unclosed one


def _tag_answer(tail: str) -> Answer:
    start = tail.rfind(_TAG)
    end = tail.find(_TAG_END, start) if start >= 0 else -1
    return _answer(tail[start + len(_TAG) : end].strip()) if end >= 0 else None


def _last(matches: Any) -> Any:
    last = None
    for last in matches:  # noqa: B007 (the final match is wanted)
        pass
    return last


def _answer_is_answer(tail: str) -> Answer:
    last = _last(_ANSWER_IS_RE.finditer(tail))
    return _answer(_line(tail, last.end(), len(tail))) if last else None


def _last_number(tail: str) -> Fraction | None:
    last = _last(_NUMBER_RE.finditer(_clean(tail)))
    return _value(last) if last else None


def _flexible_answer(tail: str) -> Answer:
    """The first extractor that finds an answer decides (a hedged one included)."""
    for extract in (_marker_answer, _boxed_answer, _tag_answer, _answer_is_answer, _last_number):
        answer = extract(tail)
        if answer is not None:
            return answer
    return None


def _parse_truth(value: Any) -> Fraction | None:
    text, _ = _tail(value)
    text = text[text.rfind(MARKER) + len(MARKER) :] if MARKER in text else text
    match = _NUMBER_RE.search(_clean(text.strip()[:ANSWER_WINDOW]))
    return _value(match) if match else None


_cached_truth = lru_cache(maxsize=4096)(_parse_truth)  # GRPO scores each truth n times


def _turns(solution: Any) -> tuple[Any, float, float]:
    """The model's last answer (what follows the last tool reply), its tool calls, the errors."""
    if not isinstance(solution, str):
        return solution, 0.0, 0.0
    replies = [part.split(REPLY_END, 1)[0].strip() for part in solution.split(REPLY)[1:]]
    errors = sum(reply.startswith(ERRORS) for reply in replies)
    return solution.rpartition(REPLY_END)[2], float(solution.count(CALL)), float(errors)


def _score(solution: Any, truth: Any, flexible: bool, weights: tuple[float, float]) -> dict:
    try:
        answer, calls, errors = _turns(solution)
        tail, clipped = _tail(answer)
        marker = _marker_answer(tail)
        pred = _flexible_answer(tail) if flexible and marker is None else marker
        short = type(truth) is str and len(truth) <= ANSWER_WINDOW
        acc = float(isinstance(pred, Fraction) and pred == (
            _cached_truth(truth) if short else _parse_truth(truth)))  # fmt: skip
        fmt = float(isinstance(marker, Fraction))
        score = weights[0] * acc + weights[1] * fmt
        flags = (pred is not None, pred is HEDGED, clipped)
        return dict(zip(KEYS, (score, acc, fmt, *map(float, flags), calls, errors), strict=True))
    except Exception:  # a reward worker must never crash on a model output
        return dict.fromkeys(KEYS, 0.0)


def compute_score(
    data_source: Any, solution_str: Any, ground_truth: Any, extra_info: Any = None, **kwargs: Any
) -> dict[str, float]:
    """1.0 when the number after the last ``####`` of the model's last answer is the truth."""
    return _score(solution_str, ground_truth, flexible=False, weights=(1.0, 0.0))


def compute_score_flexible(
    data_source: Any, solution_str: Any, ground_truth: Any, extra_info: Any = None, **kwargs: Any
) -> dict[str, float]:
    """compute_score, falling back to a box, a tag, "answer is" and the last number."""
    return _score(solution_str, ground_truth, flexible=True, weights=(1.0, 0.0))


def compute_score_format(
    data_source: Any, solution_str: Any, ground_truth: Any, extra_info: Any = None, **kwargs: Any
) -> dict[str, float]:
    """ACC_WEIGHT x flexible accuracy + FORMAT_WEIGHT x (a ``#### <number>`` line)."""
    return _score(solution_str, ground_truth, flexible=True, weights=(ACC_WEIGHT, FORMAT_WEIGHT))


REWARD_FUNCTIONS: dict[str, Callable[..., dict[str, float]]] = {
    f.__name__: f for f in (compute_score, compute_score_flexible, compute_score_format)
}
