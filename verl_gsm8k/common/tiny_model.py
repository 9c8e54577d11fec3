"""A tiny random Qwen2 with a byte-level BPE tokenizer trained offline on arithmetic word problems,
with Qwen's ChatML tokens and template (prompts render as Qwen2.5's), nothing downloaded: the
model of recipes/smoke_tiny.sh and of the tests, wherever the real weights are not needed.

    python -m verl_gsm8k.common.tiny_model OUT_DIR [--hidden-size 128] [--layers 2] [--seed 0]
        [--tool-tokens]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

# Qwen2.5-Instruct's template, as its tokenizer_config.json has it, with this model's system text:
# with tools, the system turn lists them and says how to call one; the model writes
# <tool_call>{json}</tool_call>; each tool reply is a <tool_response> in a user turn.
SYSTEM = "You are a helpful assistant."
CHATML_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content }}{%- else %}{{- '"
    + SYSTEM
    + "' }}"
    "{%- endif %}{{- '\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the"
    " user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:"
    "\\n<tools>' }}{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and"
    ' arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{"name": <function-name>,'
    ' "arguments": <args-json-object>}\\n</tool_call><|im_end|>\\n\' }}'
    "{%- elif messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>system\\n" + SYSTEM + "<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or (message.role == 'system' and not loop.first)"
    " or (message.role == 'assistant' and not message.tool_calls) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}{{- '<|im_start|>assistant' }}"
    "{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}"
    "{%- for tool_call in message.tool_calls %}"
    "{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}"
    '{{- \'\\n<tool_call>\\n{"name": "\' + tool_call.name + \'", "arguments": \' }}'
    "{{- tool_call.arguments | tojson }}{{- '}\\n</tool_call>' }}{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}"
    "{%- endif %}{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}"
    "{%- endif %}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
NAMES = ["Natalia", "Weng", "Betty", "Julie", "James", "Albert", "Mark", "Alexis", "Tina"]
THINGS = ["clips", "apples", "dollars", "pages", "eggs", "cookies", "miles", "hours", "books"]
VERBS = ["sold", "bought", "read", "baked", "earned", "walked", "gave", "found", "made"]


def _corpus(seed: int, tools: bool, n: int = 400) -> list[str]:
    """GSM8K-like sentences, the same for a seed (``tools``: and as many calculator transcripts in
    this template): enough for a few hundred BPE merges."""
    from jinja2 import Environment

    from verl_gsm8k.tools import config_path, schemas

    template = Environment().from_string(CHATML_TEMPLATE)
    tool_block = schemas(config_path("calculator"))  # its words become tokens: short tool prompts
    rng, lines = random.Random(seed), []
    for _ in range(n):
        a, b = rng.randint(1, 999), rng.randint(1, 99)
        who, what, verb = rng.choice(NAMES), rng.choice(THINGS), rng.choice(VERBS)
        question = f"{who} {verb} {a} {what} in April and half as many in May. How many {what} did"
        lines.append(
            f"{question} {who} have altogether? {a} + {b} = <<{a}+{b}={a + b}>>{a + b}. "
            f'Let\'s think step by step and output the final answer after "####". '
            f"The answer is \\boxed{{{a * b}}}.\n#### {a + b}"
        )
        if not tools:
            continue
        call = {"name": "calculator", "arguments": {"expression": f"{a}*{b}"}}
        turns = [
            {"role": "user", "content": question},
            {"role": "assistant", "content": "", "tool_calls": [{"function": call}]},
            {"role": "tool", "content": str(a * b)},
        ]
        lines.append(template.render(messages=turns, tools=tool_block))
    return lines


def _tokenizer(seed: int, tools: bool = False) -> Any:
    """A byte-level BPE of 600 tokens trained on ``_corpus(seed)``, Qwen's ChatML tokens. With
    ``tools`` (TOY_TASK=products): 1000 tokens, the calculator transcripts in the corpus,
    ``<tool_call>`` and ``</tool_call>`` one token each (not special) as Qwen2.5's, and every pair
    of digits one token: a number is read two digits at a time, so the tiny model can copy a
    question's two-digit numbers into a tool call (docs/tools.md, "On the CPU")."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok.train_from_iterator(_corpus(seed, tools), trainer=trainers.BpeTrainer(
        vocab_size=1000 if tools else 600, special_tokens=special, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))  # fmt: skip
    if tools:
        added = ["<tool_call>", "</tool_call>", *(f"{n:02d}" for n in range(100))]
        tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in added])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>", model_max_length=4096,
                                   additional_special_tokens=special[1:])  # fmt: skip
    fast.chat_template = CHATML_TEMPLATE
    return fast


def tiny_config(vocab_size: int = 600, hidden_size: int = 128, layers: int = 2, **extra: Any):
    """The tiny model's Qwen2Config: 4 heads, so hidden 128 gives head size 32, the least vLLM's
    CPU attention accepts."""
    from transformers import Qwen2Config

    return Qwen2Config(vocab_size=vocab_size, hidden_size=hidden_size, num_hidden_layers=layers,
                       intermediate_size=hidden_size * 2, num_attention_heads=4,
                       num_key_value_heads=2, max_position_embeddings=4096,
                       tie_word_embeddings=True, **extra)  # fmt: skip


def make_tiny_model(
    out_dir: str | os.PathLike, hidden_size: int = 128, layers: int = 2, seed: int = 0,
    force: bool = False, tools: bool = False,
) -> Path:  # fmt: skip
    """Built in a temporary sibling directory, then renamed into place."""
    import torch
    from transformers import GenerationConfig, Qwen2ForCausalLM

    out = Path(out_dir).resolve()
    if out.exists() and not force:
        raise FileExistsError(f"{out} already exists (pass force=True / --force to replace it)")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    tmp.chmod(0o755)  # mkdtemp's 0700 would hide the model from other users
    try:
        tok = _tokenizer(seed, tools)
        tok.save_pretrained(tmp)
        torch.manual_seed(seed)
        ids = {"bos_token_id": tok.pad_token_id, "eos_token_id": tok.eos_token_id,
               "pad_token_id": tok.pad_token_id}  # fmt: skip
        model = Qwen2ForCausalLM(tiny_config(len(tok), hidden_size, layers, **ids))
        model.generation_config = GenerationConfig(eos_token_id=tok.eos_token_id,
                                                   pad_token_id=tok.pad_token_id)  # fmt: skip
        model.save_pretrained(tmp, safe_serialization=True)
        shutil.rmtree(out, ignore_errors=True)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m verl_gsm8k.common.tiny_model",
                                     description=__doc__.split("\n\n")[0])  # fmt: skip
    parser.add_argument("out_dir", help="directory to create (must not exist unless --force)")
    parser.add_argument("--hidden-size", type=int, default=128, help="model width (default 128)")
    parser.add_argument("--layers", type=int, default=2, help="decoder layers (default 2)")
    parser.add_argument("--seed", type=int, default=0, help="seed for weights and corpus")
    parser.add_argument("--force", action="store_true", help="replace an existing out_dir")
    parser.add_argument("--tool-tokens", action="store_true", help="the calculator's tokenizer "
                        "(TOY_TASK=products): 1000 tokens, two digits one token, <tool_call> "
                        "one")  # fmt: skip
    args = parser.parse_args(argv)
    try:
        out = make_tiny_model(args.out_dir, args.hidden_size, args.layers, args.seed, args.force,
                              args.tool_tokens)  # fmt: skip
    except FileExistsError as exc:
        print(f"make_tiny_model: {exc}", file=sys.stderr)
        return 2
    print(f"tiny Qwen2 written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
