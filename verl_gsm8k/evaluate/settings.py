"""The evaluation's settings, constants and errors."""

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PROG = "eval.sh"
MODES = ("training", "evalscope", "calculator")
DEFAULT_MODES = MODES[:2]
BENCHMARK, SUBSET = "gsm8k", "main"
DATA_SOURCE = "openai/gsm8k"
# Stated, as verl's rollout: else the model's generation_config.json (Qwen2.5-Instruct: 1.1)
REPETITION_PENALTY = 1.0
# Without --run or --max-tokens (verl scores a cut answer 0: at this limit a model reads higher)
DEFAULT_MAX_TOKENS = 1024
MAX_TOKENS_FLAG = "--max-tokens"
MAX_TOKENS_DEFAULT = f"the default (no --run, no {MAX_TOKENS_FLAG})"


class EvalError(Exception):
    """One evaluation failed: its rows say so."""


class UsageError(Exception):
    """Bad arguments or inputs: one line, exit 2, nothing written."""


@dataclass
class ModelSpec:
    label: str
    source: str  # a directory, a hub id, or the model served at api_url
    api_url: str | None = None
    path: str | None = None  # resolved


@dataclass
class Settings:
    modes: list[str]
    backend: str  # vllm or transformers
    data: str
    out: Path
    max_tokens: int
    max_tokens_from: str  # MAX_TOKENS_FLAG, MAX_TOKENS_DEFAULT or the run's launch record
    limit: int | None = None
    batch_size: int | None = None  # None: 8 for transformers, 64 for a server
    dtype: str = "float32"
    repeats: int = 1  # answers sampled per question; 1: greedy
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = -1
    samples: int = 10
    api_key: str = "EMPTY"
    vllm_bin: str = "vllm"
    vllm_args: list[str] = field(default_factory=list)
    server_timeout: float = 900.0

    def generation(self) -> dict[str, Any]:
        sampled = self.repeats > 1
        return {
            "max_tokens": self.max_tokens, "max_tokens_from": self.max_tokens_from,
            "temperature": self.temperature if sampled else 0.0, "do_sample": sampled,
            "samples_per_question": self.repeats, "top_p": self.top_p if sampled else None,
            "top_k": self.top_k if sampled else None, "repetition_penalty": REPETITION_PENALTY,
            "batch_size": self.batch_size,
        }  # fmt: skip

    def key(self) -> dict[str, Any]:
        """A sweep's resume key: the data and every setting that changes an answer."""
        kept = {k: v for k, v in self.generation().items()
                if k not in ("max_tokens_from", "do_sample", "batch_size")}  # fmt: skip
        return {"modes": list(self.modes), "data": self.data, "limit": self.limit, **kept,
                "backend": self.backend, "dtype": self.dtype}  # fmt: skip

    def comparable_to(self) -> str:
        limit = f"max_tokens {self.max_tokens}, from {self.max_tokens_from}"
        if self.max_tokens_from not in (MAX_TOKENS_FLAG, MAX_TOKENS_DEFAULT):
            return ("Comparable to this run's validation score (val-core/openai/gsm8k/acc): the "
                    f"training prompt and the run's own response limit ({limit}).")  # fmt: skip
        return (f"The training prompt, at {limit}: comparable to a run's validation score "
                "(val-core/openai/gsm8k/acc) only if that equals the run's data."
                "max_response_length (verl cuts a longer answer and scores it 0, so a larger "
                "limit reads higher). `--run RUN_DIR` takes the run's own limit.")  # fmt: skip
