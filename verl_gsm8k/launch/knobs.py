"""Every knob of the recipes, once: check, default (or plan.py's rule), verl keys and doc.
``--markdown`` prints docs/knobs.md's table."""

import argparse
import math
import re
import shlex
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from verl_gsm8k.tools import TOOLS, TURNS, config_path

# Numbers as Hydra reads them: a leading zero ("007") or a sign would be read otherwise.
INT = re.compile(r"0|[1-9][0-9]*")
NUMBER = re.compile(r"(?:(?:0|[1-9][0-9]*)(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
# verl.utils.tracking.Tracking.supported_backend of verl 0.9.1 (tests compare the two).
VERL_LOGGERS = ("wandb", "mlflow", "swanlab", "vemlp_wandb", "tensorboard", "console",
                "clearml", "trackio", "file", "rl_insight")  # fmt: skip
CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"
NOT_ALGORITHMS = ("base", "ppo_lora", "sft")
_NAMES = {p.stem.removeprefix("gsm8k_") for p in CONFIG_DIR.glob("gsm8k_*.yaml")}
LEARN_ALGOS = ("ppo", "grpo", *sorted(_NAMES - {"ppo", "grpo", *NOT_ALGORITHMS}))
TRAINERS = ("ppo", "sft")


@dataclass(frozen=True)
class Check:
    rule: str  # what a good value is, in words
    ok: Callable[[str], bool]


def _int_above(value: str, low: int) -> bool:
    return bool(INT.fullmatch(value)) and int(value) > low


def _number_in(value: str, low: float, high: float, low_open: bool) -> bool:
    n = float(value) if NUMBER.fullmatch(value) else math.nan
    return math.isfinite(n) and (n > low if low_open else n >= low) and n <= high


def one_of(*values: str) -> Check:
    return Check(f"one of {', '.join(values)}", lambda value: value in values)


def _or(word: str, rule: str, check: Callable[[str], bool]) -> Check:
    return Check(rule, lambda v: v == word or check(v))


ANY = Check("any text", lambda v: True)
PATH = Check("a path (the preflight checks that it exists and loads)", bool)
POSITIVE_INT = Check("an integer > 0", lambda v: _int_above(v, 0))
NON_NEGATIVE_INT = Check("an integer >= 0", lambda v: _int_above(v, -1))
POSITIVE_NUMBER = Check("a number > 0 (e.g. 1e-6)", lambda v: _number_in(v, 0, math.inf, True))
NON_NEGATIVE_NUMBER = Check("a number >= 0", lambda v: _number_in(v, 0, math.inf, False))
FRACTION = Check("a number in (0, 1]", lambda v: _number_in(v, 0, 1, True))
FREQUENCY = _or("-1", "an integer > 0 (every N steps) or -1 (never)", POSITIVE_INT.ok)
STEPS = _or("null", "null (run TOTAL_EPOCHS) or an integer > 0", POSITIVE_INT.ok)
KEEP = _or("null", "an integer > 0, or null (keep every checkpoint)", POSITIVE_INT.ok)
FUNCTION_NAME = Check("a Python function name", str.isidentifier)
LOGGERS = Check("a comma-separated list of verl loggers with file in it "
                f"({', '.join(VERL_LOGGERS)})",
                lambda v: "file" in (n := v.split(",")) and set(n) <= {*VERL_LOGGERS})  # fmt: skip
SWITCH = one_of("0", "1")
METRIC = Check("a verl metric name (e.g. val-core/openai/gsm8k/acc/mean@1)",
               lambda v: bool(v) and " " not in v)  # fmt: skip


def hydra_quote(value: str) -> str:
    """``value`` as a Hydra quoted string: \\' a quote, backslashes doubled before a quote."""
    out, slashes = [], ""
    for char in value:
        if char == "\\":
            slashes += char
            continue
        out.append(slashes * 2 + "\\'" if char == "'" else slashes + char)
        slashes = ""
    return "'" + "".join(out) + slashes * 2 + "'"


FORMS: dict[str, Callable[[str], str]] = {
    "raw": lambda v: v,
    "quoted": hydra_quote,
    "file_list": lambda v: f"[{hydra_quote(v)}]",
    "list": lambda v: f"[{v}]",
    "bool": lambda v: "true" if v == "1" else "false",
    "tool_config": lambda v: hydra_quote(str(config_path(v))),
    "tool_agent": lambda v: "tool_agent",  # rows without agent_name run verl's tool loop
}


@dataclass(frozen=True)
class Key:
    path: str
    form: str = "raw"  # a name of FORMS
    suffix: str = ""  # appended to the value first

    def override(self, value: str) -> str:
        return f"{self.path}={FORMS[self.form](value + self.suffix)}"


@dataclass(frozen=True)
class Knob:
    name: str
    check: Check
    default: str | None
    doc: str
    ppo: tuple[Key, ...] = ()
    sft: tuple[Key, ...] = ()
    trainers: tuple[str, ...] = TRAINERS  # the trainers that read it
    rule: str = ""  # how plan.py makes the default, in words
    recipes: tuple[str, ...] = ()  # the only recipes that read it

    def keys(self, trainer: str) -> tuple[Key, ...]:
        return self.ppo if trainer == "ppo" else self.sft


def _knob(name: str, check: Check, default: str | None, doc: str, *, ppo: str = "",
          sft: str = "", both: str = "", form: str = "raw", only: str = "", rule: str = "",
          recipes: tuple[str, ...] = ()) -> Knob:  # fmt: skip
    """A row: ``ppo``, ``sft``, ``both``: space-separated keys; ``only``: its one trainer."""

    def keys(paths: str) -> tuple[Key, ...]:
        return tuple(Key(path, form) for path in f"{paths} {both}".split())

    trainers = (only,) if only else TRAINERS
    return Knob(name, check, default, doc, keys(ppo), keys(sft), trainers, rule, recipes)


RUN_DIR_KEYS = (
    Key("trainer.default_local_dir", "quoted"),
    Key("trainer.rollout_data_dir", "quoted", "/rollouts"),
    Key("trainer.validation_data_dir", "quoted", "/validation"),
)
LEARN = ("learn_tiny",)
MULTI_TURN = "actor_rollout_ref.rollout.multi_turn"
LORA = ("ppo_lora_qwen2.5-1.5b_gsm8k",)

KNOBS: tuple[Knob, ...] = (
    _knob("DEVICE", one_of("auto", "gpu", "cpu"), "auto",
          "auto: a GPU when `nvidia-smi` lists one, else the CPU for smoke_tiny and learn_tiny "
          "and a stop after the preflight for the others; cpu: the CPU platform (docs/cpu.md)"),
    _knob("ATTENTION", one_of("auto", "fa2", "fa4", "sdpa", "sdpa_packed"), "auto",
          "auto: flash-attn 2 where it loads, else sdpa, packed on a GPU and padded on the CPU; "
          "the others ask for one, refused in one line where it cannot run (docs/gpu.md)"),
    _knob("MODEL_PATH", PATH, "Qwen/Qwen2.5-0.5B-Instruct",
          "the actor's (and by default the critic's and reference's) weights: a local directory "
          "or a hub id", ppo="actor_rollout_ref.model.path", sft="model.path", form="quoted",
          rule="on a CPU the tiny random Qwen2 `$CACHE_DIR/tiny-qwen2` (learn_tiny: its warm "
          "start)"),
    _knob("CACHE_DIR", PATH, None, "where a CPU run builds the tiny model and the GSM8K sample "
          "(learn_tiny: its toy data and warm starts)",
          rule="`${XDG_CACHE_HOME:-~/.cache}/verl-gsm8k`"),
    _knob("CRITIC_MODEL_PATH", PATH, None, "the critic's initial weights",
          ppo="critic.model.path", form="quoted", only="ppo", rule="`$MODEL_PATH`"),
    _knob("NNODES", POSITIVE_INT, "1", "nodes (SFT: one)", ppo="trainer.nnodes"),
    _knob("NDEVICES_PER_NODE", POSITIVE_INT, "1", "GPUs per node",
          both="trainer.n_gpus_per_node"),
    _knob("TRAIN_BATCH_SIZE", POSITIVE_INT, "128", "prompts per step (SFT: examples)",
          both="data.train_batch_size"),
    _knob("PPO_MINI_BATCH_SIZE", POSITIVE_INT, "64", "prompts per gradient update",
          ppo="actor_rollout_ref.actor.ppo_mini_batch_size", only="ppo"),
    _knob("MAX_PROMPT_LENGTH", POSITIVE_INT, "512", "prompt tokens",
          ppo="data.max_prompt_length", only="ppo"),
    _knob("MAX_RESPONSE_LENGTH", POSITIVE_INT, "256", "response tokens",
          ppo="data.max_response_length", only="ppo"),
    _knob("OVERLONG_BUFFER_LEN", _or("auto", "auto, or an integer > 0", POSITIVE_INT.ok), None,
          "DAPO's overlong penalty: the last tokens before MAX_RESPONSE_LENGTH it covers",
          ppo="reward.reward_kwargs.overlong_buffer_cfg.len", only="ppo",
          rule="auto: a fifth of the response length verl gets, as the paper's",
          recipes=("dapo_qwen2.5-0.5b_gsm8k", *LEARN)),
    _knob("ACTOR_LR", POSITIVE_NUMBER, "1e-6", "the actor's learning rate",
          ppo="actor_rollout_ref.actor.optim.lr", only="ppo"),
    _knob("CRITIC_LR", POSITIVE_NUMBER, "1e-5", "the critic's learning rate",
          ppo="critic.optim.lr", only="ppo"),
    _knob("KL_COEF", NON_NEGATIVE_NUMBER, "0.001",
          "the KL coefficient, in the reward or in the loss as the config charges it (none: the "
          "preflight warns)", only="ppo",
          ppo="algorithm.kl_ctrl.kl_coef actor_rollout_ref.actor.kl_loss_coef"),
    _knob("ROLLOUT_TP", POSITIVE_INT, "1", "vLLM's tensor parallel size",
          ppo="actor_rollout_ref.rollout.tensor_model_parallel_size", only="ppo"),
    _knob("ROLLOUT_GPU_MEM_UTIL", FRACTION, "0.4", "the share of the card vLLM takes",
          ppo="actor_rollout_ref.rollout.gpu_memory_utilization", only="ppo"),
    _knob("ROLLOUT_N", POSITIVE_INT, "1", "responses per prompt (a group)",
          ppo="actor_rollout_ref.rollout.n", only="ppo"),
    replace(_knob("TOOLS", one_of(*TOOLS), None, "a tool the model may call through verl's "
                  "agent loop (configs/tools/<TOOLS>.yaml), on rows written by data_prep.gsm8k "
                  "--tools (docs/tools.md)", only="ppo"),
            ppo=(Key(f"{MULTI_TURN}.tool_config_path", "tool_config"),
                 Key("actor_rollout_ref.rollout.agent.default_agent_loop", "tool_agent"))),
    _knob("TOOL_TURNS", POSITIVE_INT, None, "the model's turns in a response with TOOLS (a call "
          "and the tool's reply take one; MAX_RESPONSE_LENGTH covers them all)", only="ppo",
          ppo=f"{MULTI_TURN}.max_assistant_turns", rule=f"{TURNS} with TOOLS"),
    _knob("SFT_LR", POSITIVE_NUMBER, "1e-5", "the peak of the SFT cosine schedule",
          sft="optim.lr", only="sft"),
    _knob("MAX_LENGTH", POSITIVE_INT, "1024", "prompt + answer tokens per SFT example",
          sft="data.max_length", only="sft"),
    _knob("TOTAL_EPOCHS", POSITIVE_INT, "20", "passes over the training data",
          both="trainer.total_epochs",
          rule="SFT: `TOTAL_TRAINING_STEPS` when only that is set (verl's SFT loop ends at the "
          "epochs first)"),
    _knob("TOTAL_TRAINING_STEPS", STEPS, "null", "steps to train",
          both="trainer.total_training_steps"),
    _knob("SAVE_FREQ", FREQUENCY, "20", "a checkpoint every N steps", both="trainer.save_freq"),
    _knob("TEST_FREQ", FREQUENCY, "5", "a validation every N steps", both="trainer.test_freq"),
    _knob("MAX_CKPT_TO_KEEP", KEEP, "3",
          "the newest N step directories of the whole run are kept, and always the tracked one "
          "and the kept best", sft="trainer.max_ckpt_to_keep",
          ppo="trainer.max_actor_ckpt_to_keep trainer.max_critic_ckpt_to_keep"),
    _knob("DATA_DIR", PATH, None, "where the train and test files default to",
          rule="`$HOME/data/gsm8k` (SFT: `gsm8k-sft`); on a CPU with nothing there, the "
          "GSM8K sample of `data_prep/sample/` under `$CACHE_DIR`"),
    _knob("GSM8K_TRAIN_FILE", PATH, None, "the RL training prompts", ppo="data.train_files",
          form="file_list", only="ppo", rule="`$DATA_DIR/train.parquet`"),
    _knob("GSM8K_TEST_FILE", PATH, None, "the RL validation prompts", ppo="data.val_files",
          form="file_list", only="ppo", rule="`$DATA_DIR/test.parquet`"),
    _knob("SFT_TRAIN_FILE", PATH, None, "the SFT training transcripts", sft="data.train_files",
          form="file_list", only="sft", rule="`$DATA_DIR/train.parquet`"),
    _knob("SFT_TEST_FILE", PATH, None, "the SFT validation transcripts", sft="data.val_files",
          form="file_list", only="sft", rule="`$DATA_DIR/test.parquet`"),
    _knob("REWARD_FILE", PATH, None, "the reward's Python file", form="quoted", only="ppo",
          ppo="reward.custom_reward_function.path", rule="`rewards/gsm8k.py`"),
    _knob("REWARD_FN", FUNCTION_NAME, "compute_score", "the reward function in REWARD_FILE",
          ppo="reward.custom_reward_function.name", only="ppo"),
    _knob("PROJECT_NAME", ANY, "verl_gsm8k", "the logger's project",
          both="trainer.project_name", form="quoted"),
    _knob("EXPERIMENT_NAME", ANY, None, "the run's name: the same name again resumes the run",
          both="trainer.experiment_name", form="quoted",
          rule="the recipe's name (learn_tiny: `learn_tiny_<ALGO>_<UTC time>`, a new run)"),
    _knob("RUNS_ROOT", PATH, None, "the parent of the default run directory",
          rule="`runs/` in this repository"),
    replace(_knob("RUN_DIR", PATH, None, "checkpoints, metrics, logs, generations",
                  rule="`$RUNS_ROOT/$EXPERIMENT_NAME`"),
            ppo=RUN_DIR_KEYS, sft=RUN_DIR_KEYS[:1]),
    _knob("LOGGER", LOGGERS, None,
          "verl's loggers; file writes RUN_DIR/metrics/, which the report, the watchdog and a "
          "resume read; wandb with WANDB_MODE=offline needs no key and no network",
          both="trainer.logger", form="list",
          rule="`console,file`, plus `wandb` when `WANDB_API_KEY` is set"),
    _knob("TRACE_SAMPLES", NON_NEGATIVE_INT, "4",
          "responses per step traced token by token into RUN_DIR/trace/ (0: off)",
          ppo="gsm8k_trace.samples", only="ppo"),
    _knob("WATCHDOG", one_of("stop", "warn", "off"), "stop",
          "stop: a sick step (NaN, KL blow-up, collapse) ends the run before its checkpoint, "
          "exit 4; warn: said, the run goes on", ppo="gsm8k_guard.watchdog.mode", only="ppo"),
    _knob("KEEP_BEST", SWITCH, "1", "1: the checkpoint of the best validation score is kept "
          "(`merge.sh RUN_DIR OUT --best`)", ppo="gsm8k_guard.keep_best", form="bool", only="ppo"),
    _knob("BEST_METRIC", METRIC, "val-core/openai/gsm8k/acc/mean@1", "what KEEP_BEST ranks by",
          ppo="gsm8k_guard.best_metric", form="quoted", only="ppo"),
    _knob("SAVE_EVERY_MIN", _or("auto", "auto, or minutes >= 0 (0: none)",
                                NON_NEGATIVE_NUMBER.ok), "auto",
          "a checkpoint at the first step this many minutes after the last save, besides "
          "SAVE_FREQ: what a SIGKILL can lose", ppo="gsm8k_guard.save_every_min", only="ppo",
          rule="auto: the slowest save measured in RUN_DIR/timings.json over 3% (at least 1; "
          "20 before a save was measured)"),
    _knob("STOP_GRACE_S", NON_NEGATIVE_INT, None,
          "after SIGTERM, the seconds verl has to finish the step and save it; then it is "
          "stopped, exit 5", rule="what a stop needs by RUN_DIR/timings.json, at least 30; in a "
          "Slurm job with a time limit: until 5 s before its end"),
    _knob("LOCK_WAIT_S", NON_NEGATIVE_INT, "0", "another launch trains into RUN_DIR: seconds "
          "to wait for it to end, then refused in one line, exit 2"),
    _knob("RESUME", one_of("auto", "force", "disable"), "auto",
          "auto: resume a checkpoint only if its config is the same; force: resume it anyway; "
          "disable: set it aside and start over"),
    _knob("DRY_RUN", SWITCH, "0", "1: the preflight, then verl's composed config; no GPU"),
    _knob("SKIP_PREFLIGHT", SWITCH, "0", "1: launch without the preflight (not advised)"),
    _knob("TOKEN_BUDGET", one_of("auto", "recipe"), "auto",
          "auto: micro-batch token budgets that would not fit this node's card cut to the "
          "largest power of two that fits (PPO; your own *_max_token_len_per_gpu wins)"),
    _knob("LORA_RANK", POSITIVE_INT, None, "the actor's LoRA rank (the critic trains fully)",
          ppo="actor_rollout_ref.model.lora_rank", only="ppo", recipes=LORA),
    _knob("LORA_ALPHA", POSITIVE_NUMBER, None, "the actor's LoRA alpha",
          ppo="actor_rollout_ref.model.lora_alpha", only="ppo", recipes=LORA),
    _knob("SMOKE_PROMPTS", POSITIVE_INT, None, "train and validation prompts used",
          ppo="data.train_max_samples data.val_max_samples", only="ppo",
          recipes=("smoke_tiny",)),
    _knob("ALGO", one_of(*LEARN_ALGOS), None, "the algorithm: configs/gsm8k_<ALGO>.yaml",
          only="ppo", recipes=LEARN),
    _knob("SEED", NON_NEGATIVE_INT, None, "`data.seed`, the toy data's and the warm start's",
          ppo="data.seed", only="ppo", recipes=LEARN),
    _knob("TOY_TASK", one_of("easy", "products"), None, "easy: sums up to 4 + 4, a converged "
          "warm start; products: two-digit products, handed to the calculator (TOOLS=calculator)",
          only="ppo", recipes=LEARN),
    _knob("WARM_START_STEPS", POSITIVE_INT, None, "SFT steps of the warm start",
          only="ppo", recipes=LEARN, rule="400; with TOY_TASK=products at most 1500, ending "
          "once its validation loss is under 0.1"),
)  # fmt: skip
BY_NAME = {knob.name: knob for knob in KNOBS}


def shown(name: str, value: str) -> str:
    return f"{name}={shlex.quote(value)}"


def problems(values: Mapping[str, str]) -> list[str]:
    """One line per bad value (other names ignored), then whether the batch splits."""
    from verl_gsm8k.preflight.batch import batch_split_problem

    lines = [f"{shown(name, value)} is not {BY_NAME[name].check.rule}"
             for name, value in values.items()
             if name in BY_NAME and not BY_NAME[name].check.ok(value)]  # fmt: skip
    batch, mini = (values.get(n, "") for n in ("TRAIN_BATCH_SIZE", "PPO_MINI_BATCH_SIZE"))
    if _int_above(batch, 0) and _int_above(mini, 0):
        lines += filter(None, [batch_split_problem(int(batch), int(mini))])
    return lines


def recipe_arguments(recipe_file: Path) -> list[str]:
    """The words of a recipe file's ``recipe=( ... )`` array."""
    text = Path(recipe_file).read_text(encoding="utf-8")
    body = text[text.index("recipe=(") + len("recipe=(") :]
    return shlex.split(body[: body.index("\n)")], comments=True)


def recipe_settings(recipe_file: Path) -> dict[str, str]:
    pairs = (word.partition("=") for word in recipe_arguments(recipe_file))
    return {name: value for name, sep, value in pairs if sep and name in BY_NAME}


def _row(knob: Knob, own: list[str]) -> str:
    default = "; ".join(filter(None, [knob.default and f"`{knob.default}`", knob.rule]))
    if own:
        default = f"{default or '(none)'}; " + ", ".join(own)
    keys = [f"{t.upper()}: " + ", ".join(f"`{k.path}`" for k in knob.keys(t))
            for t in TRAINERS if knob.keys(t)]  # fmt: skip
    doc = knob.doc
    if knob.recipes:
        doc += f" ({', '.join(knob.recipes)} only)"
    elif knob.trainers != TRAINERS:
        doc += f" ({knob.trainers[0].upper()} only)"
    cells = (f"`{knob.name}`", knob.check.rule, default, "; ".join(keys) or "(the launcher)", doc)
    return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"


def markdown_table(recipes_dir: Path) -> str:
    own: dict[str, list[str]] = {}
    for recipe in sorted(recipes_dir.glob("*.sh")):
        for name, value in recipe_settings(recipe).items():
            own.setdefault(name, []).append(f"{recipe.stem} `{value}`")
    rows = ["| knob | a good value | default | verl key | what it does |", "|---|---|---|---|---|"]
    return "\n".join([*rows, *(_row(k, own.get(k.name, [])) for k in KNOBS)]) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m verl_gsm8k.launch.knobs", description="Check "
                                     "knob values (one line per bad value, exit 2), or print the "
                                     "table as docs/knobs.md shows it.")  # fmt: skip
    parser.add_argument("assignments", nargs="*", metavar="NAME=VALUE",
                        help="knob values to check; other names are ignored")  # fmt: skip
    parser.add_argument("--markdown", action="store_true", help="print the table and exit")
    args = parser.parse_args(argv)
    if args.markdown:
        print(markdown_table(CONFIG_DIR.parent / "recipes"), end="")
        return 0
    lines = problems(dict(item.partition("=")[::2] for item in args.assignments))
    for line in lines:
        print(f"knobs: {line}", file=sys.stderr)
    return 2 if lines else 0


if __name__ == "__main__":
    sys.exit(main())
