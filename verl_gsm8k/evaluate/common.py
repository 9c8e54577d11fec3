"""What every part of the GSM8K evaluation shares: constants, errors, a model, the settings.

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
