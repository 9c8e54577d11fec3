"""The calculator mode: each test question in a chat with the calculator, as verl's tool_agent
loop runs it (Hermes ``<tool_call>``), against vLLM's OpenAI API; the last answer scored by our
reward. EvalScope's modes stay tool-free."""

import json
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from verl_gsm8k.evaluate.settings import EvalError, Settings
from verl_gsm8k.tools import TURNS

MODE = "calculator"
VLLM_TOOL_ARGS = ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"]


def _chat(url: str, model: str, messages: list[dict], tools: list[dict], s: Settings) -> dict:
    body = {"model": model, "messages": messages, "tools": tools, "max_tokens": s.max_tokens,
            "temperature": 0.0}  # fmt: skip
    request = urllib.request.Request(
        f"{url.rstrip('/')}/chat/completions", data=json.dumps(body).encode(), method="POST",
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {s.api_key}"},
    )  # fmt: skip
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.loads(response.read())["choices"][0]["message"]


def answer(function: dict) -> tuple[str, bool]:
    """The tool's reply to one call and whether it failed, in the words verl's loop answers with
    (verl/experimental/agent_loop/tool_agent_loop.py, ToolAgentLoop._call_tool)."""
    from verl_gsm8k.tools.calculator import calculate

    name = function.get("name")
    if name != MODE:
        return f"Unknown function '{name}'. Available tools: {[MODE]}", True
    try:
        arguments = json.loads(function.get("arguments") or "{}")
    except (ValueError, TypeError) as exc:
        return f"Invalid JSON in arguments for '{name}': {exc}", True
    reply = calculate(arguments)
    return reply, reply.startswith("error:")


def solve(url: str, model: str, question: str, tools: list[dict], s: Settings) -> dict[str, Any]:
    """One question's chat: the model's turns, each call answered by the calculator."""
    from data_prep.gsm8k import TOOL_PROMPTS

    messages = [{"role": "system", "content": TOOL_PROMPTS[MODE]},
                {"role": "user", "content": question}]  # fmt: skip
    calls = errors = 0
    for _ in range(TURNS):
        said = _chat(url, model, messages, tools, s)
        asked = said.get("tool_calls") or []
        messages.append({"role": "assistant", "content": said.get("content") or "",
                         **({"tool_calls": asked} if asked else {})})  # fmt: skip
        if not asked:
            break
        for call in asked:
            reply, failed = answer(call.get("function") or {})
            calls, errors = calls + 1, errors + failed
            messages.append({"role": "tool", "tool_call_id": call.get("id", ""), "content": reply})
    return {"messages": messages, "answer": messages[-1].get("content") or "", "tool_calls": calls,
            "tool_errors": errors}  # fmt: skip


def evaluate(url: str | None, model: str, rows: list[dict], s: Settings) -> dict[str, Any]:
    """Accuracy over ``rows`` with the calculator, its calls, each question's chat."""
    from data_prep.gsm8k import ground_truth
    from rewards.gsm8k import compute_score
    from verl_gsm8k.tools import config_path, schemas

    if url is None:
        raise EvalError(f"the {MODE} mode needs an OpenAI API: a vLLM server (--backend vllm) "
                        "or --api-url")  # fmt: skip
    tools = schemas(config_path(MODE))
    with ThreadPoolExecutor(max_workers=s.batch_size or 16) as pool:
        chats = list(pool.map(lambda row: solve(url, model, row["question"], tools, s), rows))
    for row, chat in zip(rows, chats, strict=True):
        chat["acc"] = compute_score("openai/gsm8k", chat["answer"], ground_truth(row["answer"]))[
            "acc"
        ]
    n = len(chats)
    called = [c for c in chats if c["tool_calls"]]
    return {
        "accuracy": sum(c["acc"] for c in chats) / n if n else None, "n": n,
        "tool_call_rate": len(called) / n if n else None,
        "accuracy_with_call": sum(c["acc"] for c in called) / len(called) if called else None,
        "tool_errors": sum(c["tool_errors"] for c in chats), "chats": chats,
    }  # fmt: skip
