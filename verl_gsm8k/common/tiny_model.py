"""Write a tiny random Qwen2 model with an offline-trained BPE tokenizer (nothing is downloaded).

It stands in for Qwen2.5 wherever the real weights are not needed: config validation, dataset
loading, checkpoint save/merge, evaluation plumbing, and real PPO training on a CPU
(recipes/smoke_tiny.sh builds one on first use).
The tokenizer is a byte-level BPE trained on a small built-in corpus of arithmetic word problems,
with Qwen's ChatML special tokens and chat template, so prompts render exactly like Qwen2.5's.

    python -m verl_gsm8k.common.tiny_model OUT_DIR [--hidden-size 128] [--layers 2] [--seed 0]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
from pathlib import Path

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def _corpus(seed: int, n: int = 400) -> list[str]:
    """Deterministic GSM8K-flavoured sentences, enough for a few hundred BPE merges."""
    rng = random.Random(seed)
    names = ["Natalia", "Weng", "Betty", "Julie", "James", "Albert", "Mark", "Alexis", "Tina"]
    things = ["clips", "apples", "dollars", "pages", "eggs", "cookies", "miles", "hours", "books"]
    verbs = ["sold", "bought", "read", "baked", "earned", "walked", "gave", "found", "made"]
    lines = []
    for _ in range(n):
        a, b = rng.randint(1, 999), rng.randint(1, 99)
        who, what, verb = rng.choice(names), rng.choice(things), rng.choice(verbs)
        lines.append(
            f"{who} {verb} {a} {what} in April and half as many in May. "
            f"How many {what} did {who} have altogether? {a} + {b} = <<{a}+{b}={a + b}>>{a + b}. "
            f'Let\'s think step by step and output the final answer after "####". '
            f"The answer is \\boxed{{{a * b}}}.\n#### {a + b}"
        )
    return lines


def build_tokenizer(out_dir: Path, seed: int = 0, vocab_size: int = 600):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(seed), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
        model_max_length=4096,
    )
    fast.chat_template = CHATML_TEMPLATE
    fast.save_pretrained(out_dir)
    return fast


def tiny_config(vocab_size: int = 600, hidden_size: int = 128, layers: int = 2, **extra):
    """The tiny model's Qwen2Config (its shape alone: the GPU probe's CPU check builds it with
    random weights, no tokenizer)."""
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        **extra,
    )


def build_model(out_dir: Path, tokenizer, hidden_size: int, layers: int, seed: int) -> None:
    import torch
    from transformers import GenerationConfig, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = tiny_config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        layers=layers,
        bos_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    model.save_pretrained(out_dir, safe_serialization=True)


def make_tiny_model(
    out_dir: str | os.PathLike,
    hidden_size: int = 128,
    layers: int = 2,
    seed: int = 0,
    force: bool = False,
) -> Path:
    """Build the model in a temporary sibling directory, then rename it into place."""
    out = Path(out_dir).resolve()
    if out.exists() and not force:
        raise FileExistsError(f"{out} already exists (pass force=True / --force to replace it)")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; a model directory is normally world-readable
    try:
        tokenizer = build_tokenizer(tmp, seed=seed)
        build_model(tmp, tokenizer, hidden_size=hidden_size, layers=layers, seed=seed)
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m verl_gsm8k.common.tiny_model", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("out_dir", help="directory to create (must not exist unless --force)")
    parser.add_argument(
        "--hidden-size",
        type=int,
        default=128,
        help="model width; 4 attention heads, so 128 gives head size 32, the least vLLM's CPU "
        "attention accepts (default 128)",
    )
    parser.add_argument("--layers", type=int, default=2, help="decoder layers (default 2)")
    parser.add_argument("--seed", type=int, default=0, help="seed for weights and corpus")
    parser.add_argument("--force", action="store_true", help="replace an existing out_dir")
    args = parser.parse_args(argv)
    try:
        out = make_tiny_model(args.out_dir, args.hidden_size, args.layers, args.seed, args.force)
    except FileExistsError as exc:
        print(f"make_tiny_model: {exc}", file=sys.stderr)
        return 2
    print(f"tiny Qwen2 written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
