"""The evaluation's settings and what every part of it shares: constants, errors, a model.

Standard library only. ``data_prep`` and ``rewards`` are imported as the packages they are: the
project is installed (editable) in .venv-eval too.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROG = "eval.sh"
MODES = ("training", "evalscope")
BENCHMARK = "gsm8k"
SUBSET = "main"
DATA_SOURCE = "openai/gsm8k"
REWARD_FILE = ROOT / "rewards" / "gsm8k.py"
DEFAULT_SAMPLES = 10
LOG_TAIL_LINES = 40
REPETITION_PENALTY = 1.0
# Without --run or --max-tokens. The recipes train and validate at data.max_response_length (256
# by default): verl scores an answer it cut off as 0, so at this larger limit a model reads higher
# than its validation score said.
DEFAULT_MAX_TOKENS = 1024
MAX_TOKENS_FLAG = "--max-tokens"
MAX_TOKENS_DEFAULT = f"the default (no --run, no {MAX_TOKENS_FLAG})"


class EvalError(Exception):
    """A user-facing failure of one evaluation (bad model, server did not start, ...)."""


class UsageError(Exception):
    """Bad arguments or inputs: one line, exit 2, nothing evaluated."""


@dataclass
class ModelSpec:
    label: str  # model_id in EvalScope's outputs and in the tables
    source: str  # what the user gave: a directory, a hub id, or an API model name
    api_url: str | None = None  # set: an already-running OpenAI-compatible server
    path: str | None = None  # resolved local directory (local models)


@dataclass
class Settings:
    modes: list[str]
    backend: str
    max_tokens: int
    batch_size: int | None  # None: 8 for the transformers backend, 64 for a server
    limit: int | None
    dtype: str
    api_key: str
    vllm_bin: str
    vllm_args: list[str]
    server_timeout: float
    port: int | None
    samples: int
    out: Path
    repeats: int = 1  # answers sampled per question (--samples-per-question); 1: greedy
    temperature: float = 0.0  # sampling temperature when repeats > 1
    top_p: float = 1.0  # nucleus sampling when repeats > 1 (verl's rollout: 1.0, off)
    top_k: int = -1  # top-k sampling when repeats > 1 (verl's rollout: -1, off)
    # where max_tokens came from: MAX_TOKENS_FLAG, MAX_TOKENS_DEFAULT, or a run's launch record
    # ("data.max_response_length of RUN_DIR/launches/launch-<stamp>.yaml")
    max_tokens_from: str = MAX_TOKENS_DEFAULT

    @property
    def max_tokens_from_run(self) -> bool:
        return self.max_tokens_from not in (MAX_TOKENS_FLAG, MAX_TOKENS_DEFAULT)


def training_comparable_to(settings: Settings) -> str:
    """What a training-mode score compares with: verl's validation score only at the run's own
    response limit (verl cuts an answer at data.max_response_length and scores it 0)."""
    limit = f"max_tokens {settings.max_tokens}, from {settings.max_tokens_from}"
    if settings.max_tokens_from_run:
        return (
            "Comparable to this run's validation score (val-core/openai/gsm8k/acc): the training "
            f"prompt and the run's own response limit ({limit})."
        )
    return (
        f"The training prompt, at {limit}: comparable to a run's validation score "
        "(val-core/openai/gsm8k/acc) only if that equals the run's data.max_response_length "
        "(verl cuts a longer answer and scores it 0, so a larger limit reads higher). "
        "`--run RUN_DIR` takes the run's own limit."
    )
