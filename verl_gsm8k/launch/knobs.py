"""Every knob of the recipes, once: its check, its default (or the rule that makes it), the verl
key(s) it sets for each trainer, and one line of doc. Standard library only.

    python -m verl_gsm8k.launch.knobs --markdown    # docs/knobs.md's table, generated from this one

A recipe file (recipes/*.sh) gives a knob its own default as ``NAME=VALUE`` before ``--``; the
environment wins over it, and ``key=value`` arguments after ``--`` win over everything (they go to
verl last). Knobs whose default is a rule (paths, names) are made by ``plan.py``.

To add a knob: one row in KNOBS (and its key(s): the launch passes them to verl), then regenerate
docs/knobs.md (tests/test_knobs.py says the command when they differ).
"""

from __future__ import annotations

import argparse
import math
import re
import shlex
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from verl_gsm8k.warm_start.band import is_band

# Values as Hydra parses them into numbers: a leading zero ("007") or a sign would make Hydra read
# a string or surprise the user, so only plain decimal forms pass.
INT = re.compile(r"0|[1-9][0-9]*")
NUMBER = re.compile(r"(?:(?:0|[1-9][0-9]*)(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
# verl.utils.tracking.Tracking.supported_backend of verl 0.9.1 (tests compare the two).
VERL_LOGGERS = (
    "wandb", "mlflow", "swanlab", "vemlp_wandb", "tensorboard", "console", "clearml", "trackio",
    "file", "rl_insight",
)  # fmt: skip
CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"
# The configs that are not an algorithm of their own: the shared base, the LoRA variant of PPO's
# recipe (a 1.5B model on a 24 GB card), and the SFT trainer's.
NOT_ALGORITHMS = ("base", "ppo_lora", "sft")


def _learn_algos(config_dir: Path = CONFIG_DIR) -> tuple[str, ...]:
    """learn_tiny's ALGO values: every configs/gsm8k_<name>.yaml that is an algorithm, PPO and
    GRPO first (the two the suite learns with), then by name. A new algorithm's config is its
    ALGO: nothing to list here."""
    names = {p.stem.removeprefix("gsm8k_") for p in config_dir.glob("gsm8k_*.yaml")}
    rest = sorted(names - {"ppo", "grpo", *NOT_ALGORITHMS})
    return ("ppo", "grpo", *rest)


LEARN_ALGOS = _learn_algos()
TRAINERS = ("ppo", "sft")


@dataclass(frozen=True)
class Check:
    rule: str  # what a good value is, in words: shown in errors and in docs/knobs.md
    ok: Callable[[str], bool]  # the test on the raw string the user set


def _int(value: str) -> int | None:
    return int(value) if INT.fullmatch(value) else None


def _number_in(value: str, low: float, high: float, low_open: bool) -> bool:
    if not NUMBER.fullmatch(value) or not math.isfinite(float(value)):
        return False
    number = float(value)
    return (number > low if low_open else number >= low) and number <= high


def one_of(*values: str) -> Check:
    return Check(f"one of {', '.join(values)}", lambda value: value in values)


def _int_above(value: str, low: int) -> bool:
    number = _int(value)
    return number is not None and number > low


ANY = Check("any text", lambda v: True)
PATH = Check("a path (the preflight checks that it exists and loads)", bool)
NAME = Check("a name without '/'", lambda v: bool(v) and "/" not in v)
POSITIVE_INT = Check("an integer > 0", lambda v: _int_above(v, 0))
NON_NEGATIVE_INT = Check("an integer >= 0", lambda v: _int_above(v, -1))
POSITIVE_NUMBER = Check("a number > 0 (e.g. 1e-6)", lambda v: _number_in(v, 0, math.inf, True))
NON_NEGATIVE_NUMBER = Check("a number >= 0", lambda v: _number_in(v, 0, math.inf, False))
FRACTION = Check("a number in (0, 1]", lambda v: _number_in(v, 0, 1, True))
FREQUENCY = Check(
    "an integer > 0 (every N steps) or -1 (never)", lambda v: v == "-1" or _int_above(v, 0)
)
STEPS = Check(
    "null (run TOTAL_EPOCHS) or an integer > 0", lambda v: v == "null" or _int_above(v, 0)
)
KEEP = Check(
    "an integer > 0, or null (keep every checkpoint)", lambda v: v == "null" or _int_above(v, 0)
)
FUNCTION_NAME = Check("a Python function name", str.isidentifier)
LOGGERS = Check(
    f"a comma-separated list of verl loggers ({', '.join(VERL_LOGGERS)})",
    lambda v: bool(v) and all(name in VERL_LOGGERS for name in v.split(",")),
)
SWITCH = one_of("0", "1")
METRIC = Check(
    "a verl metric name (e.g. val-core/openai/gsm8k/acc/mean@1)",
    lambda v: bool(v) and " " not in v,
)
BAND = Check(
    "last, or an accuracy band LOW-HIGH with 0 <= LOW <= HIGH <= 1 (e.g. 0.30-0.45)",
    lambda v: v == "last" or is_band(v),
)


def hydra_quote(value: str) -> str:
    """``value`` as a quoted Hydra string that reads back verbatim: quotes, spaces, commas, '='
    all survive. In Hydra's quoted strings \\' is a quote, and backslashes are doubled only
    before a quote (or the closing one)."""
    out, slashes = [], ""
    for char in value:
        if char == "\\":
            slashes += char
            continue
        out.append(slashes * 2 + "\\'" if char == "'" else slashes + char)
        slashes = ""
    return "'" + "".join(out) + slashes * 2 + "'"


# How a knob's value is written into its key: as typed, quoted, a quoted one-item list, a list,
# a boolean from 0/1.
FORMS: dict[str, Callable[[str], str]] = {
    "raw": lambda v: v,
    "quoted": hydra_quote,
    "file_list": lambda v: f"[{hydra_quote(v)}]",
    "list": lambda v: f"[{v}]",
    "bool": lambda v: "true" if v == "1" else "false",
}


@dataclass(frozen=True)
class Key:
    path: str  # the verl key
    form: str = "raw"  # a name of FORMS
    suffix: str = ""  # appended to the value first (RUN_DIR/rollouts)

    def override(self, value: str) -> str:
        return f"{self.path}={FORMS[self.form](value + self.suffix)}"


@dataclass(frozen=True)
class Knob:
    name: str
    check: Check
    default: str | None  # the value when neither the environment nor the recipe sets one
    doc: str  # one line: what it does
    ppo: tuple[Key, ...] = ()  # keys it sets when the recipe runs verl's PPO trainer
    sft: tuple[Key, ...] = ()  # ... its SFT trainer
    trainers: tuple[str, ...] = TRAINERS  # the trainers that read it (else: ignored, said so)
    rule: str = ""  # how plan.py makes the default, in words (docs), when it is not a constant
    recipes: tuple[str, ...] = field(default=())  # the only recipes that read it (docs)

    def keys(self, trainer: str) -> tuple[Key, ...]:
        return self.ppo if trainer == "ppo" else self.sft


def _keys(*paths: str, form: str = "raw") -> tuple[Key, ...]:
    return tuple(Key(path, form) for path in paths)


PPO = ("ppo",)
SFT = ("sft",)
RUN_DIR_PPO = (
    Key("trainer.default_local_dir", "quoted"),
    Key("trainer.rollout_data_dir", "quoted", "/rollouts"),
    Key("trainer.validation_data_dir", "quoted", "/validation"),
)

# One row per knob, in the order the docs list them.
KNOBS: tuple[Knob, ...] = (
    Knob("DEVICE", one_of("auto", "gpu", "cpu"), "auto",
         "auto: a GPU when `nvidia-smi` lists one; without one the recipes marked "
         "`--cpu-by-default` (smoke_tiny, learn_tiny) train on the CPU and the others stop after "
         "the preflight. cpu adds `configs/device/cpu.yaml` and the CPU platform (docs/cpu.md); "
         "gpu insists on a GPU"),
    Knob("ATTENTION", one_of("auto", "fa2", "fa4", "sdpa", "sdpa_packed"), "auto",
         "auto: flash-attn 2 where its extension loads, else sdpa with padding removal on a GPU "
         "(`configs/attention/sdpa_packed.yaml`) and sdpa padded on the CPU; fa2, fa4, sdpa, "
         "sdpa_packed ask for one, refused in one line where this machine cannot run it "
         "(docs/gpu.md, flash-attn 4)"),
    Knob("MODEL_PATH", PATH, "Qwen/Qwen2.5-0.5B-Instruct",
         "the actor's (and by default the critic's and reference's) weights: a local directory "
         "or a hub id",
         ppo=_keys("actor_rollout_ref.model.path", form="quoted"),
         sft=_keys("model.path", form="quoted"),
         rule="on a CPU the tiny random Qwen2 `$CACHE_DIR/tiny-qwen2`, built on first use "
         "(learn_tiny: its warm start)"),
    Knob("CACHE_DIR", PATH, None,
         "where a CPU run builds the tiny model and prepares the shipped GSM8K sample (learn_tiny: "
         "its toy data and warm starts)", rule="`${XDG_CACHE_HOME:-~/.cache}/verl-gsm8k`"),
    Knob("CRITIC_MODEL_PATH", PATH, None, "the critic's initial weights",
         ppo=_keys("critic.model.path", form="quoted"), trainers=PPO, rule="`$MODEL_PATH`"),
    Knob("NNODES", POSITIVE_INT, "1", "nodes (SFT: one node; anything else is refused)",
         ppo=_keys("trainer.nnodes")),
    Knob("NDEVICES_PER_NODE", POSITIVE_INT, "1",
         "GPUs per node (SFT: also torchrun's `--nproc_per_node`)",
         ppo=_keys("trainer.n_gpus_per_node"), sft=_keys("trainer.n_gpus_per_node")),
    Knob("TRAIN_BATCH_SIZE", POSITIVE_INT, "128",
         "prompts per step (SFT: examples per optimizer step)",
         ppo=_keys("data.train_batch_size"), sft=_keys("data.train_batch_size")),
    Knob("PPO_MINI_BATCH_SIZE", POSITIVE_INT, "64",
         "prompts per gradient update (the critic follows)",
         ppo=_keys("actor_rollout_ref.actor.ppo_mini_batch_size"), trainers=PPO),
    Knob("MAX_PROMPT_LENGTH", POSITIVE_INT, "512", "prompt tokens",
         ppo=_keys("data.max_prompt_length"), trainers=PPO),
    Knob("MAX_RESPONSE_LENGTH", POSITIVE_INT, "256", "response tokens",
         ppo=_keys("data.max_response_length"), trainers=PPO),
    Knob("OVERLONG_BUFFER_LEN", Check("auto, or an integer > 0",
                                      lambda v: v == "auto" or _int_above(v, 0)), None,
         "DAPO's overlong penalty: the last tokens before MAX_RESPONSE_LENGTH it covers",
         ppo=_keys("reward.reward_kwargs.overlong_buffer_cfg.len"), trainers=PPO,
         rule="auto: a fifth of the response length verl gets (MAX_RESPONSE_LENGTH, or "
         "data.max_response_length= after --), as the paper's (4096 of 20480 tokens)",
         recipes=("dapo_qwen2.5-0.5b_gsm8k", "learn_tiny")),
    Knob("ACTOR_LR", POSITIVE_NUMBER, "1e-6", "the actor's learning rate",
         ppo=_keys("actor_rollout_ref.actor.optim.lr"), trainers=PPO),
    Knob("CRITIC_LR", POSITIVE_NUMBER, "1e-5", "the critic's learning rate",
         ppo=_keys("critic.optim.lr"), trainers=PPO),
    Knob("KL_COEF", NON_NEGATIVE_NUMBER, "0.001",
         "the KL coefficient: in the reward (PPO) or in the loss (GRPO), as the config uses it; "
         "set where a config charges no KL (DAPO, GSPO, Dr. GRPO), the preflight warns",
         ppo=_keys("algorithm.kl_ctrl.kl_coef", "actor_rollout_ref.actor.kl_loss_coef"),
         trainers=PPO),
    Knob("ROLLOUT_TP", POSITIVE_INT, "1", "vLLM's tensor parallel size",
         ppo=_keys("actor_rollout_ref.rollout.tensor_model_parallel_size"), trainers=PPO),
    Knob("ROLLOUT_GPU_MEM_UTIL", FRACTION, "0.4", "the share of the card vLLM takes",
         ppo=_keys("actor_rollout_ref.rollout.gpu_memory_utilization"), trainers=PPO),
    Knob("ROLLOUT_N", POSITIVE_INT, "1", "responses per prompt (a group)",
         ppo=_keys("actor_rollout_ref.rollout.n"), trainers=PPO),
    Knob("SFT_LR", POSITIVE_NUMBER, "1e-5", "the peak of the SFT cosine schedule",
         sft=_keys("optim.lr"), trainers=SFT),
    Knob("MAX_LENGTH", POSITIVE_INT, "1024", "prompt + answer tokens per SFT example",
         sft=_keys("data.max_length"), trainers=SFT),
    Knob("TOTAL_EPOCHS", POSITIVE_INT, "20", "passes over the training data",
         ppo=_keys("trainer.total_epochs"), sft=_keys("trainer.total_epochs"),
         rule="SFT: `TOTAL_TRAINING_STEPS` when only that is set (verl's SFT loop stops at the "
         "epochs first)"),
    Knob("TOTAL_TRAINING_STEPS", STEPS, "null", "steps to train (null: TOTAL_EPOCHS)",
         ppo=_keys("trainer.total_training_steps"), sft=_keys("trainer.total_training_steps")),
    Knob("SAVE_FREQ", FREQUENCY, "20", "a checkpoint every N steps",
         ppo=_keys("trainer.save_freq"), sft=_keys("trainer.save_freq")),
    Knob("TEST_FREQ", FREQUENCY, "5", "a validation every N steps",
         ppo=_keys("trainer.test_freq"), sft=_keys("trainer.test_freq")),
    Knob("MAX_CKPT_TO_KEEP", KEEP, "3",
         "the newest N step directories of the whole run are kept, never the one the tracker "
         "names nor the kept best (docs/reliability.md)",
         ppo=_keys("trainer.max_actor_ckpt_to_keep", "trainer.max_critic_ckpt_to_keep"),
         sft=_keys("trainer.max_ckpt_to_keep")),
    Knob("DATA_DIR", PATH, None, "where the train and test files default to",
         rule="`$HOME/data/gsm8k` (SFT: `$HOME/data/gsm8k-sft`); on a CPU with nothing prepared "
         "there, the GSM8K sample of `data_prep/sample/` prepared under `$CACHE_DIR`"),
    Knob("GSM8K_TRAIN_FILE", PATH, None, "the RL training prompts",
         ppo=_keys("data.train_files", form="file_list"), trainers=PPO,
         rule="`$DATA_DIR/train.parquet`"),
    Knob("GSM8K_TEST_FILE", PATH, None, "the RL validation prompts",
         ppo=_keys("data.val_files", form="file_list"), trainers=PPO,
         rule="`$DATA_DIR/test.parquet`"),
    Knob("SFT_TRAIN_FILE", PATH, None, "the SFT training transcripts",
         sft=_keys("data.train_files", form="file_list"), trainers=SFT,
         rule="`$DATA_DIR/train.parquet`"),
    Knob("SFT_TEST_FILE", PATH, None, "the SFT validation transcripts",
         sft=_keys("data.val_files", form="file_list"), trainers=SFT,
         rule="`$DATA_DIR/test.parquet`"),
    Knob("REWARD_FILE", PATH, None, "the reward's Python file",
         ppo=_keys("reward.custom_reward_function.path", form="quoted"), trainers=PPO,
         rule="`rewards/gsm8k.py` of this repository"),
    Knob("REWARD_FN", FUNCTION_NAME, "compute_score", "the reward function in REWARD_FILE",
         ppo=_keys("reward.custom_reward_function.name"), trainers=PPO),
    Knob("PROJECT_NAME", ANY, "verl_gsm8k", "the logger's project",
         ppo=_keys("trainer.project_name", form="quoted"),
         sft=_keys("trainer.project_name", form="quoted")),
    Knob("EXPERIMENT_NAME", ANY, None,
         "the run's name: the same name again resumes that run",
         ppo=_keys("trainer.experiment_name", form="quoted"),
         sft=_keys("trainer.experiment_name", form="quoted"),
         rule="the recipe's name (learn_tiny: `learn_tiny_<ALGO>_<UTC time>`, a new run each "
         "launch)"),
    Knob("RUNS_ROOT", PATH, None, "the parent of the default run directory",
         rule="`runs/` in this repository"),
    Knob("RUN_DIR", PATH, None,
         "checkpoints, metrics, logs, generations (docs/guide.md, A run directory)",
         ppo=RUN_DIR_PPO, sft=(Key("trainer.default_local_dir", "quoted"),),
         rule="`$RUNS_ROOT/$EXPERIMENT_NAME`"),
    Knob("LOGGER", LOGGERS, None,
         "verl's loggers; with WANDB_MODE=offline wandb needs no key and no network: "
         "LOGGER=console,file,wandb WANDB_MODE=offline",
         ppo=_keys("trainer.logger", form="list"), sft=_keys("trainer.logger", form="list"),
         rule="`console,file`, plus `wandb` when `WANDB_API_KEY` is set"),
    Knob("TRACE_SAMPLES", NON_NEGATIVE_INT, "4",
         "responses per step traced token by token into RUN_DIR/trace/ (0: off; docs/replay.md)",
         ppo=_keys("gsm8k_trace.samples"), trainers=PPO),
    Knob("WATCHDOG", one_of("stop", "warn", "off"), "stop",
         "stop: a sick step (NaN, KL blow-up, collapse) ends the run before its checkpoint, exit "
         "4; warn: said, the run goes on (docs/reliability.md)",
         ppo=_keys("gsm8k_guard.watchdog.mode"), trainers=PPO),
    Knob("KEEP_BEST", SWITCH, "1",
         "1: the checkpoint of the best validation score is kept beside the last "
         "MAX_CKPT_TO_KEEP (`merge.sh RUN_DIR --best`)",
         ppo=(Key("gsm8k_guard.keep_best", "bool"),), trainers=PPO),
    Knob("BEST_METRIC", METRIC, "val-core/openai/gsm8k/acc/mean@1", "what KEEP_BEST ranks by",
         ppo=_keys("gsm8k_guard.best_metric", form="quoted"), trainers=PPO),
    Knob("SAVE_EVERY_MIN", Check("auto, or minutes >= 0 (0: none)",
                                 lambda v: v == "auto" or NON_NEGATIVE_NUMBER.ok(v)), "auto",
         "a checkpoint after the first step past each this many minutes since the last save, "
         "besides SAVE_FREQ: what a SIGKILL can lose (docs/reliability.md)",
         ppo=_keys("gsm8k_guard.save_every_min"), trainers=PPO,
         rule="auto: the slowest save measured in RUN_DIR/timings.json over 3% (at least 1 min; "
         "20 before any save was measured)"),
    Knob("STOP_GRACE_S", NON_NEGATIVE_INT, None,
         "after SIGTERM, the seconds verl has to finish the step in flight and save it; then it "
         "is stopped, exit 5 (docs/reliability.md, Preemption)",
         rule="what a stop needs, from the step and save measured in RUN_DIR/timings.json, at "
         "least 30; in a Slurm job with a time limit: until 5 s before its end (before Slurm's "
         "SIGKILL, KillWait after a requeue's or scancel's SIGTERM)"),
    Knob("LOCK_WAIT_S", NON_NEGATIVE_INT, "0",
         "another launch trains into RUN_DIR: seconds to wait for it to end, then refused in one "
         "line, exit 2"),
    Knob("RESUME", one_of("auto", "force", "disable"), "auto",
         "a relaunch into a run with a checkpoint: auto resumes it only if its config is the "
         "same, force resumes it anyway, disable sets it aside and starts over (docs/resume.md)"),
    Knob("DRY_RUN", SWITCH, "0", "1: the preflight, then verl's composed config; no GPU needed"),
    Knob("SKIP_PREFLIGHT", SWITCH, "0", "1: launch without the preflight (not advised)"),
    Knob("TOKEN_BUDGET", one_of("auto", "recipe"), "auto",
         "auto: where the micro-batch token budgets would not fit this node's card, the "
         "largest power of two that fits (PPO; your own *_max_token_len_per_gpu wins)"),
    Knob("LORA_RANK", POSITIVE_INT, None, "the actor's LoRA rank (the critic trains fully)",
         ppo=_keys("actor_rollout_ref.model.lora_rank"), trainers=PPO,
         recipes=("ppo_lora_qwen2.5-1.5b_gsm8k",)),
    Knob("LORA_ALPHA", POSITIVE_NUMBER, None, "the actor's LoRA alpha",
         ppo=_keys("actor_rollout_ref.model.lora_alpha"), trainers=PPO,
         recipes=("ppo_lora_qwen2.5-1.5b_gsm8k",)),
    Knob("SMOKE_PROMPTS", POSITIVE_INT, None, "train and validation prompts used",
         ppo=_keys("data.train_max_samples", "data.val_max_samples"), trainers=PPO,
         recipes=("smoke_tiny",)),
    Knob("ALGO", one_of(*LEARN_ALGOS), None,
         "the algorithm: configs/gsm8k_<ALGO>.yaml (docs/algorithms.md)", trainers=PPO,
         recipes=("learn_tiny",)),
    Knob("SEED", NON_NEGATIVE_INT, None,
         "`data.seed`; also the toy data's and the warm start's seed",
         ppo=_keys("data.seed"), trainers=PPO, recipes=("learn_tiny",)),
    Knob("TOY_TASK", one_of("easy", "hard"), None,
         "easy: sums up to 4 + 4 from a converged warm start; hard: up to 9 + 9 from a warm "
         "start that knows part of them (docs/algorithms.md)", trainers=PPO,
         recipes=("learn_tiny",)),
    Knob("WARM_START_STEPS", POSITIVE_INT, None,
         "SFT steps of the warm start (at most)", trainers=PPO, recipes=("learn_tiny",),
         rule="400; 300 with TOY_TASK=hard"),
    Knob("WARM_START_ACC", BAND, None,
         "which save of the warm start's SFT run starts RL: the last, or the first whose greedy "
         "accuracy is in the band (python -m verl_gsm8k.warm_start)", trainers=PPO,
         recipes=("learn_tiny",), rule="last; 0.30-0.45 with TOY_TASK=hard"),
)  # fmt: skip
BY_NAME = {knob.name: knob for knob in KNOBS}


def shown(name: str, value: str) -> str:
    """NAME=value as the user would type it in a shell."""
    return f"{name}={shlex.quote(value)}"


def problems(values: Mapping[str, str]) -> list[str]:
    """One line per bad value (names not in the table are ignored), then the cross-check of the
    two batch sizes (only when both are valid: a bad one has its own line already)."""
    from verl_gsm8k.preflight.batch import batch_split_problem

    lines = [
        f"{shown(name, value)} is not {BY_NAME[name].check.rule}"
        for name, value in values.items()
        if name in BY_NAME and not BY_NAME[name].check.ok(value)
    ]
    batch = _int(values.get("TRAIN_BATCH_SIZE", ""))
    mini = _int(values.get("PPO_MINI_BATCH_SIZE", ""))
    if batch and mini:
        split = batch_split_problem(batch, mini)
        if split:
            lines.append(split)
    return lines


def recipe_arguments(recipe_file: Path) -> list[str]:
    """The launcher arguments a recipe file passes: the words of its ``recipe=( ... )`` array."""
    text = Path(recipe_file).read_text(encoding="utf-8")
    body = text[text.index("recipe=(") + len("recipe=(") :]
    return shlex.split(body[: body.index("\n)")], comments=True)


def recipe_settings(recipe_file: Path) -> dict[str, str]:
    """The ``NAME=VALUE`` knob defaults a recipe file gives (docs and tests)."""
    pairs = (word.partition("=") for word in recipe_arguments(recipe_file))
    return {name: value for name, sep, value in pairs if sep and name in BY_NAME}


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def markdown_table(recipes_dir: Path) -> str:
    """docs/knobs.md's table: each knob, a good value, its default (and each recipe's own), the
    verl keys for each trainer, what it does."""
    per_recipe: dict[str, list[str]] = {}
    for recipe in sorted(recipes_dir.glob("*.sh")):
        for name, value in recipe_settings(recipe).items():
            per_recipe.setdefault(name, []).append(f"{recipe.stem} `{value}`")
    rows = [
        "| knob | a good value | default | verl key | what it does |",
        "|---|---|---|---|---|",
    ]
    for knob in KNOBS:
        default = f"`{knob.default}`" if knob.default is not None else ""
        if knob.rule:
            default = f"{default}; {knob.rule}" if default else knob.rule
        if knob.name in per_recipe:
            default = f"{default or '(none)'}; " + ", ".join(per_recipe[knob.name])
        keys = []
        for trainer in TRAINERS:
            paths = ", ".join(f"`{key.path}`" for key in knob.keys(trainer))
            if paths:
                keys.append(f"{trainer.upper()}: {paths}")
        if not keys:
            keys = ["(the launcher)"]
        doc = knob.doc
        if knob.recipes:
            doc += f" ({', '.join(knob.recipes)} only)"
        elif knob.trainers != TRAINERS:
            doc += f" ({knob.trainers[0].upper()} only)"
        cells = (f"`{knob.name}`", knob.check.rule, default, "; ".join(keys), doc)
        rows.append("| " + " | ".join(_cell(cell) for cell in cells) + " |")
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m verl_gsm8k.launch.knobs",
        description="Check knob values against the table of knobs (one line per bad value, exit "
        "2), or print the table as docs/knobs.md shows it.",
    )
    parser.add_argument(
        "assignments", nargs="*", metavar="NAME=VALUE",
        help="knob values to check; names not in the table are ignored",
    )  # fmt: skip
    parser.add_argument(
        "--markdown", action="store_true", help="print the table as Markdown and exit"
    )
    args = parser.parse_args(argv)
    if args.markdown:
        print(markdown_table(Path(__file__).resolve().parents[2] / "recipes"), end="")
        return 0
    values = dict(item.partition("=")[::2] for item in args.assignments)
    lines = problems(values)
    for line in lines:
        print(f"knobs: {line}", file=sys.stderr)
    return 2 if lines else 0


if __name__ == "__main__":
    sys.exit(main())
