"""learn_tiny's hooks (recipes/learn_tiny.sh): the algorithm's config; the toy task and the warm
start, built once and cached under CACHE_DIR/learn-tiny/; the report at the end."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from verl_gsm8k.common.run_dir import new_stamp
from verl_gsm8k.launch.knobs import BY_NAME
from verl_gsm8k.launch.plan import CONFIG_DIR, ROOT, Plan, Values

CACHE_VERSION = 2  # bumped when the toy task or the warm start changes: an older cache is unused
# TOY_TASK -> what it is, data_prep.arithmetic's arguments, the warm start (SFT steps, example
# length, its early end), the cache subfolder and the launch's own settings. easy: a converged
# warm start (does it learn?); products: two-digit products handed to the calculator (does it
# learn the tool? docs/tools.md, "On the CPU", on its warm start's end and sampled validation).
TOY = {
    "easy": dict(what="sums up to 4 + 4", task=["--max-operand", "4"], steps="400",
                 length="160", sub=""),
    "products": dict(what="two-digit products, with the calculator", task=["--task", "products"],
                     steps="1500", length="320", sub="products/", validate="100",
                     stop=["gsm8k_sft.stop_val_loss=0.1"],
                     launch={"TOOLS": "calculator", "MAX_PROMPT_LENGTH": "256",
                             "MAX_RESPONSE_LENGTH": "80", "TOTAL_TRAINING_STEPS": "10",
                             "ACTOR_LR": "1e-3"},
                     overrides=["actor_rollout_ref.rollout.val_kwargs.temperature=1.0",
                                "actor_rollout_ref.rollout.val_kwargs.n=4"]),
}  # fmt: skip
# The warm start: 32 demonstrations a step, a cosine rate from 3e-3 to 3e-4 (docs/learning.md).
WARM_START = {"SFT_LR": "3e-3", "TRAIN_BATCH_SIZE": "32"}


def defaults(values: Values, extra: dict[str, str]) -> None:
    """The algorithm's config, the toy task's defaults, the warm start as MODEL_PATH."""
    algo = values.get("ALGO") or "ppo"
    if (CONFIG_DIR / f"gsm8k_{algo}.yaml").is_file():  # else the knob check says why
        values.recipe.config = f"gsm8k_{algo}"
    task = values.get("TOY_TASK") or "easy"
    toy = TOY.get(task, TOY["easy"])
    values.set_default("WARM_START_STEPS", toy["steps"])
    for name, value in toy.get("launch", {}).items():
        values.set_default(name, value)
    values.recipe.overrides += toy.get("overrides", [])  # the user's key=value still win
    values.set_default("EXPERIMENT_NAME", f"learn_tiny_{algo}_{new_stamp()}")  # a new run each
    seed = f"{toy['sub']}seed{values.get('SEED') or '0'}"
    home = Path(values.get("CACHE_DIR") or ".", f"learn-tiny/v{CACHE_VERSION}", seed).absolute()
    warm = f"warm-start-{values.get('WARM_START_STEPS')}"
    extra.update(home=str(home), toy_dir=str(home / "data"), warm_start=str(home / warm),
                 task=task)  # fmt: skip
    values.set_default("MODEL_PATH", str(home / warm))
    values.set_default("DATA_DIR", str(home / "data" / "rl"))
    if algo == "dapo":  # the overlong buffer: a fifth of the response length, as the paper's
        values.set_default("OVERLONG_BUFFER_LEN", "auto")


def _say(line: str, err: bool = False) -> None:
    print(line, file=sys.stderr if err else sys.stdout, flush=True)


def prepare(plan: Plan) -> None:
    """The toy data and the warm start, when missing."""
    from verl_gsm8k.launch.cli import quiet

    values, toy = plan.values, Path(plan.extra["toy_dir"])
    warm = Path(plan.extra["warm_start"])
    need_warm = values["MODEL_PATH"] == str(warm) and not (warm / "config.json").exists()
    uses_toy = values.get("DATA_DIR") == str(toy / "rl")
    if (need_warm or uses_toy) and not (toy / "rl" / "test.parquet").exists():
        task, seed = TOY[plan.extra["task"]], values.get("SEED", "0")
        _say(f"recipe: the toy task ({plan.extra['task']}: {task['what']} in GSM8K's format, "
             f"seed {seed}) -> {toy}")  # fmt: skip
        from data_prep.arithmetic import main as arithmetic
        from data_prep.gsm8k import main as gsm8k

        quiet(arithmetic, ["--out-dir", str(toy), "--seed", seed, *task["task"]])
        tool = task.get("launch", {}).get("TOOLS")
        tools = ["--tools", tool] if tool else []
        quiet(gsm8k, ["--source", str(toy), "--out-dir", str(toy / "rl"), *tools])
    if need_warm:
        tiny, tools = _tiny(plan)
        if not (tiny / "config.json").exists():
            _say(f"recipe: building the tiny random Qwen2 (offline, once) -> {tiny}")
            from verl_gsm8k.common.tiny_model import main as build_tiny

            quiet(build_tiny, [str(tiny), "--force", *(["--tool-tokens"] if tools else [])])
        build_warm_start(plan, toy, warm)


def _tiny(plan: Plan) -> tuple[Path, bool]:
    """The tiny model the warm start trains: the calculator's task has its own tokenizer."""
    tools = "TOOLS" in TOY[plan.extra["task"]].get("launch", {})
    tiny = plan.tiny_model_dir
    return (tiny.with_name("tiny-qwen2-tools") if tools else tiny), tools


def _run(argv: list[str], log: Path, failed: str, **kwargs) -> None:
    """``argv``, its output appended to ``log``; a failure is one line naming the log, exit 1."""
    from verl_gsm8k.launch.cli import Exit

    with open(log, "ab") as out:
        done = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, check=False, **kwargs)
    if done.returncode:
        _say(f"recipe: {failed} failed; its log: {log}", err=True)
        raise Exit(1)


def build_warm_start(plan: Plan, toy: Path, warm: Path) -> None:
    """verl's SFT run on the toy demonstrations (a child with none of this run's knobs), its last
    step merged to ``warm``."""
    home, values, task = Path(plan.extra["home"]), plan.values, TOY[plan.extra["task"]]
    run, log = home / "warm-start-run", home / "warm-start.log"
    steps = values["WARM_START_STEPS"]
    most = "at most " if "stop" in task else ""  # the products warm start may end early
    _say(
        f"recipe: warm start (once): {most}{steps} steps of verl's SFT trainer on the toy "
        f"demonstrations -> {warm} (log: {log})"
    )
    # a build killed mid-merge leaves merge.sh's hidden copy beside the model: replaced here
    for stale in (run, *warm.parent.glob(f".{warm.name}.merging-*")):
        shutil.rmtree(stale, ignore_errors=True)
    home.mkdir(parents=True, exist_ok=True)
    log.write_bytes(b"")
    env = {k: v for k, v in os.environ.items() if k not in BY_NAME}
    env.pop("VERL_USE_EXTERNAL_MODULES", None)
    env.update(WARM_START, DEVICE="gpu" if plan.train_on == "gpu" else "cpu", DRY_RUN="0",
               MODEL_PATH=str(_tiny(plan)[0]), PYTHON=plan.python, MAX_LENGTH=task["length"],
               SFT_TRAIN_FILE=str(toy / "warm_start/train.parquet"),
               SFT_TEST_FILE=str(toy / "warm_start/test.parquet"), TOTAL_TRAINING_STEPS=steps,
               SAVE_FREQ=steps, TEST_FREQ=task.get("validate", steps), MAX_CKPT_TO_KEEP="3",
               LOGGER="console,file", RUN_DIR=str(run))  # fmt: skip
    _run(["bash", str(ROOT / "recipes/sft_qwen2.5-0.5b_gsm8k.sh"), "optim.lr_scheduler_type=cosine",
          "optim.min_lr_ratio=0.1", "optim.lr_warmup_steps_ratio=0",
          "checkpoint.save_contents=[model,optimizer,extra]",
          f"trainer.seed={values.get('SEED', '0')}", *task.get("stop", [])], log,
         "the warm start's SFT run", env=env)  # fmt: skip
    _run(["bash", str(ROOT / "scripts/merge.sh"), str(run), str(warm), "--force"], log,
         "merging the warm start", env={**os.environ, "PYTHON": plan.python})  # fmt: skip
    shutil.rmtree(run, ignore_errors=True)


def after(plan: Plan, status: int) -> None:
    """The report of a finished run: validation accuracy at step 0 (the warm start) and last."""
    if status != 0:
        return
    _say("recipe: step 0 is the warm start; the report below reads its validation accuracy "
         "(greedy, toy test split) and the last step's")  # fmt: skip
    run_dir = str(plan.run_dir)
    if subprocess.run([plan.python, "-m", "verl_gsm8k.report", run_dir], check=False).returncode:
        _say(f"recipe: the report failed (python -m verl_gsm8k.report {run_dir})", err=True)
