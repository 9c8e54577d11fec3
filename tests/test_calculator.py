"""The calculator tool, as verl's agent loop calls it: built by verl's tool registry from
configs/tools/calculator.yaml, each call through ToolAgentLoop._call_tool."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
from verl.experimental.agent_loop.tool_agent_loop import AgentData, ToolAgentLoop
from verl.experimental.agent_loop.tool_parser import FunctionCall
from verl.tools.tool_registry import initialize_tools_from_config

from verl_gsm8k.tools.calculator import MAX_CHARS, calculate

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "tools" / "calculator.yaml"


@pytest.fixture(scope="module")
def loop() -> ToolAgentLoop:
    """verl's loop with only what _call_tool reads: the tools of our config, the reply limit."""
    (tool,) = initialize_tools_from_config(str(CONFIG))
    loop = ToolAgentLoop.__new__(ToolAgentLoop)
    loop.tools = {tool.name: tool}
    loop.max_tool_response_length = 256
    loop.tool_response_truncate_side = "middle"
    return loop


def call(loop: ToolAgentLoop, name: str, arguments: str) -> str:
    data = AgentData([], None, None, None, None, {}, "r", {})
    data._active_tools = loop.tools
    response, reward, _ = asyncio.run(
        loop._call_tool(FunctionCall(name=name, arguments=arguments), {}, data)
    )
    assert reward == 0.0
    return response.text


def expr(text: str) -> str:
    return json.dumps({"expression": text})


@pytest.mark.parametrize(
    ("expression", "value"),
    [("48*72", "3456"), ("(48/2)+48", "72"), ("7/2", "3.5"), ("-3 + 2^10", "1021"),
     ("2**-3", "0.125"), ("0.1+0.2", "0.3"), ("1/3", "0.333333333333")],
)  # fmt: skip
def test_arithmetic_is_computed_exactly(loop, expression: str, value: str) -> None:
    assert call(loop, "calculator", expr(expression)) == value


LONG = f"error: the expression is longer than {MAX_CHARS}"
BAD_CALLS = {
    "code": ("calculator", expr("__import__('os').system('touch {marker}')"), "error: only"),
    "a name": ("calculator", expr("x + 1"), "error: only"),
    "an attribute": ("calculator", expr("(1).real"), "error: only"),
    "a call": ("calculator", expr("abs(-1)"), "error: only"),
    "a lambda": ("calculator", expr("(lambda: 1)()"), "error: only"),
    "a power tower": ("calculator", expr("9**9**9"), "error: exponents"),
    "a result too large": ("calculator", expr("99999999999**3"), "error: result too large"),
    "a huge literal": ("calculator", expr("1" + "0" * 120), "error: result too large"),
    "a long expression": ("calculator", expr("1+" * 150 + "1"), LONG),
    "deep nesting": ("calculator", expr("(" * 99 + "1" + ")" * 99), "1"),
    "division by zero": ("calculator", expr("7/(3-3)"), "error: division by zero"),
    "not arithmetic": ("calculator", expr("7 +* 2"), "error: not an arithmetic expression"),
    "a string argument": ("calculator", json.dumps("48/2"), "error: call it with"),
    "no expression": ("calculator", json.dumps({"formula": "1+1"}), "error: call it with"),
    "a list expression": ("calculator", json.dumps({"expression": [1, 2]}), "error: call it with"),
    "an unknown tool": ("python", expr("1+1"), "Unknown function 'python'"),
    "arguments not JSON": ("calculator", "{expression: 1+1", "Invalid JSON"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(BAD_CALLS))
def test_every_bad_call_is_an_error_text_in_milliseconds(loop, case: str, tmp_path: Path) -> None:
    name, arguments, answer = BAD_CALLS[case]
    marker = tmp_path / "ran"
    started = time.perf_counter()
    text = call(loop, name, arguments.replace("{marker}", str(marker)))
    seconds = time.perf_counter() - started
    assert text.startswith(answer), text
    assert seconds < 0.05, f"{case}: {seconds * 1000:.1f} ms"
    assert not marker.exists()


def test_the_calculator_never_sees_the_ground_truth(loop) -> None:
    """Whatever verl hands it beside the arguments (the trajectory, its row's fields), the answer
    is the arithmetic's: the same call gives the same text for every row."""
    data = AgentData([{"role": "user", "content": "#### 5"}], None, None, None, None, {}, "r", {})
    data._active_tools = loop.tools
    kwargs = {"calculator": {"create_kwargs": {"ground_truth": "5"}}}
    response, _, _ = asyncio.run(
        loop._call_tool(FunctionCall(name="calculator", arguments=expr("2+2")), kwargs, data)
    )
    assert response.text == "4" == calculate({"expression": "2+2"})


def test_the_schema_we_render_is_the_one_verls_loop_dumps(loop) -> None:
    """The data's SFT rows, the preflight and the evaluation read the schema with PyYAML; verl's
    agent loop dumps it through its own model (tool_agent_loop.py:119): the same dict."""
    from verl_gsm8k.tools import schemas

    dumped = [t.tool_schema.model_dump(exclude_unset=True, exclude_none=True)
              for t in loop.tools.values()]  # fmt: skip
    assert schemas(CONFIG) == dumped


def test_the_evaluations_calculator_mode_answers_each_call_and_scores_the_last_answer(loop):
    """The evaluation's tool mode against a stub OpenAI server: each call answered in verl's
    loop's words and sent back as a tool message, the last answer scored by our reward; a
    question answered at once makes no call."""
    from openai_stub import StubServer

    from verl_gsm8k.evaluate.settings import Settings
    from verl_gsm8k.evaluate.tool_mode import evaluate

    def asks(name: str, arguments: str) -> dict:
        call = {"id": "c1", "type": "function", "function": {"name": name, "arguments": arguments}}
        return {"role": "assistant", "content": "", "tool_calls": [call]}

    calls = {"48 boxes of 72": ("calculator", expr("48*72")), "5 boxes of 6": ("python", "{}"),
             "7 boxes of 8": ("calculator", "{bad")}  # fmt: skip
    answers = {**{q: asks(*c) for q, c in calls.items()}, "3 boxes of 4": "#### 13",
               "3456": "#### 3456", "Unknown function": "#### 30",
               "Invalid JSON": "#### 56"}  # fmt: skip
    rows = [{"question": f"How many pens are in {q}?", "answer": f"#### {a}"}
            for q, a in (("48 boxes of 72", 3456), ("3 boxes of 4", 12), ("5 boxes of 6", 30),
                         ("7 boxes of 8", 56))]  # fmt: skip
    settings = Settings(modes=["calculator"], backend="api", data="", out=Path("."),
                        max_tokens=64, max_tokens_from="test")  # fmt: skip
    with StubServer(answers) as stub:
        got = evaluate(stub.url, "stub", rows, settings)
    for q, (name, arguments) in calls.items():
        last = [r["messages"] for r in stub.requests if q in r["messages"][1]["content"]][-1]
        assert [m["role"] for m in last] == ["system", "user", "assistant", "tool"]
        assert last[-1]["content"] == call(loop, name, arguments)  # verl's loop says the same
    assert stub.requests[0]["tools"][0]["function"]["name"] == "calculator"
    shares = (got["accuracy"], got["n"], got["tool_call_rate"], got["accuracy_with_call"])
    assert shares == (0.75, 4, 0.75, 1.0) and got["tool_errors"] == 2
    assert [c["tool_calls"] for c in got["chats"]] == [1, 0, 1, 1]


def test_the_tiny_models_template_renders_tool_turns_as_qwen25s(tiny_model_dir: Path) -> None:
    """Tools in the system turn, the call as <tool_call> JSON, the reply as a <tool_response> user
    turn (Qwen2.5-Instruct's format); verl's Hermes parser reads the call back."""
    from transformers import AutoTokenizer
    from verl.experimental.agent_loop.tool_parser import HermesToolParser

    from verl_gsm8k.tools import schemas

    tok, tools = AutoTokenizer.from_pretrained(tiny_model_dir), schemas(CONFIG)
    fn = {"name": "calculator", "arguments": {"expression": "48/2"}}
    text = tok.apply_chat_template(
        [{"role": "system", "content": "S"}, {"role": "user", "content": "Q?"},
         {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": fn}]},
         {"role": "tool", "content": "24"}, {"role": "assistant", "content": "#### 24"}],
        tools=tools, tokenize=False)  # fmt: skip
    turn = f"<tool_call>\n{json.dumps(fn)}\n</tool_call>"
    assert text.startswith("<|im_start|>system\nS\n\n# Tools\n\n")
    assert f"<tools>\n{json.dumps(tools[0])}\n</tools>" in text
    assert f"<|im_start|>user\nQ?<|im_end|>\n<|im_start|>assistant\n{turn}<|im_end|>\n" in text
    assert "<|im_start|>user\n<tool_response>\n24\n</tool_response><|im_end|>\n" in text
    _, calls = asyncio.run(HermesToolParser(tok).extract_tool_calls(tok.encode(turn)))
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [tuple(fn.values())]


def test_the_calculators_tiny_tokenizer_reads_two_digits_as_one_token(tmp_path: Path) -> None:
    """--tool-tokens (TOY_TASK=products, docs/tools.md "On the CPU"): "78*59" is [78][*][59],
    <tool_call> one token."""
    from transformers import AutoTokenizer

    from verl_gsm8k.common.tiny_model import make_tiny_model

    tok = AutoTokenizer.from_pretrained(make_tiny_model(tmp_path / "tools", tools=True))
    assert (
        tok.tokenize("78*59") == ["78", "*", "59"]
        and tok.tokenize("<tool_call>\n")[0] == "<tool_call>"
    )
