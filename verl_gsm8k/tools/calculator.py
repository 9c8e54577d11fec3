"""The calculator the tool recipes give the model (verl_tool.py wraps it), standard library only.

It evaluates arithmetic and nothing else: numbers, ``+ - * /``, parentheses, and powers (``**`` or
``^``) with an integer exponent of at most ``MAX_EXPONENT``. The expression is parsed with
``ast`` and each node computed with ``fractions.Fraction``: no name, call or attribute is ever
looked up, so no call runs code. A bad call gets its error back as the tool's text, starting
``error:``, and the rollout goes on. It never sees the ground truth.
"""

from __future__ import annotations

import ast
from fractions import Fraction
from typing import Any

MAX_CHARS = 200  # longer expressions are refused before parsing (ast's own limits are far above)
MAX_EXPONENT = 64
MAX_DIGITS = 30  # a value whose numerator or denominator passes 10**30 is refused
_LIMIT = 10**MAX_DIGITS
USAGE = 'error: call it with {"expression": "<arithmetic>"}, e.g. {"expression": "(48/2)+48"}'
_OPS = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
}


class CalcError(ValueError):
    """What the model is told, after ``error:``."""


def _check(value: Fraction) -> Fraction:
    if abs(value.numerator) > _LIMIT or value.denominator > _LIMIT:
        raise CalcError(f"result too large (more than {MAX_DIGITS} digits)")
    return value


def _power(base: Fraction, exponent: Fraction) -> Fraction:
    if exponent.denominator != 1 or abs(exponent) > MAX_EXPONENT:
        raise CalcError(f"exponents must be whole numbers from -{MAX_EXPONENT} to {MAX_EXPONENT}")
    if base == 0 and exponent < 0:
        raise CalcError("division by zero")
    # |base| ** |exponent| is bounded before it is computed: 9**64 is 62 digits at most.
    if abs(base.numerator) > _LIMIT or base.denominator > _LIMIT:
        raise CalcError(f"result too large (more than {MAX_DIGITS} digits)")
    return _check(base ** int(exponent))


def _value(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Expression):
        return _value(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        try:
            value = Fraction(str(node.value))
        except (ValueError, OverflowError):
            raise CalcError(f"not a finite number: {node.value}") from None
        return _check(value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        operand = _value(node.operand)
        return -operand if isinstance(node.op, ast.USub) else operand
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
        return _power(_value(node.left), _value(node.right))
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Div) and right == 0:
            raise CalcError("division by zero")
        return _check(_OPS[type(node.op)](left, right))
    raise CalcError("only numbers, + - * / ** ^ and parentheses are allowed")


def show(value: Fraction) -> str:
    """A whole number as itself, else a decimal of 12 significant digits."""
    return str(value.numerator) if value.denominator == 1 else f"{float(value):.12g}"


def calculate(arguments: Any) -> str:
    """The tool's text for one call's arguments (verl passes the parsed JSON): never raises."""
    if not isinstance(arguments, dict) or "expression" not in arguments:
        return USAGE
    expression = arguments["expression"]
    if isinstance(expression, (int, float)) and not isinstance(expression, bool):
        expression = str(expression)
    if not isinstance(expression, str) or not expression.strip():
        return USAGE
    if len(expression) > MAX_CHARS:
        return f"error: the expression is longer than {MAX_CHARS} characters"
    try:
        tree = ast.parse(expression.replace("^", "**").strip(), mode="eval")
        return show(_value(tree))
    except CalcError as exc:
        return f"error: {exc}"
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return f"error: not an arithmetic expression: {expression[:60]}"
