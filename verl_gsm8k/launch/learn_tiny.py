"""learn_tiny's hooks (recipes/learn_tiny.sh): the algorithm's config, the toy task, the warm start.

First use builds, cached under CACHE_DIR/learn-tiny/v2[/hard]/seed$SEED: the toy task (sums in
GSM8K's format, data_prep.arithmetic, then verl's RL parquet by data_prep.gsm8k) and the warm start
(verl's SFT trainer by recipes/sft_qwen2.5-0.5b_gsm8k.sh; its last step, or with a WARM_START_ACC
band the first save whose greedy accuracy is in it, python -m verl_gsm8k.warm_start; merged by
scripts/merge.sh). At the end the report shows validation accuracy at step 0 and last.
"""

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
# TOY_TASK -> (largest operand, the warm start's SFT steps, WARM_START_ACC, cache subfolder):
# easy: a converged warm start (does it learn?); hard: one that knows part of the sums (which
# learns best? docs/algorithms.md).
TOY = {"easy": (4, "400", "last", ""), "hard": (9, "300", "0.30-0.45", "hard/")}
SAVE_EVERY = 10  # SFT steps between the saves scored for a WARM_START_ACC band
# The warm start: 32 demonstrations a step, a cosine rate from 3e-3 to 3e-4 (docs/learning.md).
WARM_START = {"SFT_LR": "3e-3", "TRAIN_BATCH_SIZE": "32", "MAX_LENGTH": "160"}


def defaults(values: Values, extra: dict[str, str]) -> None:
    """The algorithm's config, the toy task's defaults, the warm start as MODEL_PATH."""
    algo = values.get("ALGO") or "ppo"
    if (CONFIG_DIR / f"gsm8k_{algo}.yaml").is_file():  # else the knob check says why
        values.recipe.config = f"gsm8k_{algo}"
    operand, steps, acc, sub = TOY.get(values.get("TOY_TASK") or "easy", TOY["easy"])
    values.set_default("WARM_START_STEPS", steps)
    values.set_default("WARM_START_ACC", acc)
    values.set_default("EXPERIMENT_NAME", f"learn_tiny_{algo}_{new_stamp()}")  # a new run each
    seed = f"{sub}seed{values.get('SEED') or '0'}"
    home = Path(values.get("CACHE_DIR") or ".", f"learn-tiny/v{CACHE_VERSION}", seed).absolute()
    warm = f"warm-start-{values.get('WARM_START_STEPS')}"
    if values.get("WARM_START_ACC") != "last":
        warm += f"-acc{values.get('WARM_START_ACC')}"
    extra.update(home=str(home), toy_dir=str(home / "data"), warm_start=str(home / warm),
                 max_operand=str(operand))  # fmt: skip
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
        operand, seed = plan.extra["max_operand"], values.get("SEED", "0")
        _say(f"recipe: the toy task ({values.get('TOY_TASK', 'easy')}: sums up to {operand} + "
             f"{operand} in GSM8K's format, seed {seed}) -> {toy}")  # fmt: skip
        from data_prep.arithmetic import main as arithmetic
        from data_prep.gsm8k import main as gsm8k

        quiet(arithmetic, ["--out-dir", str(toy), "--seed", seed, "--max-operand", operand])
        quiet(gsm8k, ["--source", str(toy), "--out-dir", str(toy / "rl")])
    if need_warm:
        tiny = plan.tiny_model_dir
        if not (tiny / "config.json").exists():
            _say(f"recipe: building the tiny random Qwen2 (offline, once) -> {tiny}")
            from verl_gsm8k.common.tiny_model import main as build_tiny

            quiet(build_tiny, [str(tiny), "--force"])
        build_warm_start(plan, toy, warm)


def _run(argv: list[str], log: Path, failed: str, capture: bool = False, **kwargs):
    """``argv``, its output appended to ``log`` (``capture``: its errors, its output returned);
    a failure is one line naming the log, exit 1."""
    from verl_gsm8k.launch.cli import Exit

    with open(log, "ab") as out:
        done = subprocess.run(argv, stdout=subprocess.PIPE if capture else out, text=capture,
                              stderr=out if capture else subprocess.STDOUT, check=False,
                              **kwargs)  # fmt: skip
    if done.returncode:
        _say(f"recipe: {failed} failed; its log: {log}", err=True)
        raise Exit(1)
    return done


def build_warm_start(plan: Plan, toy: Path, warm: Path) -> None:
    """verl's SFT run on the toy demonstrations (a child with none of this run's knobs), the save
    picked, merged to ``warm``."""
    home, values = Path(plan.extra["home"]), plan.values
    run, log = home / "warm-start-run", home / "warm-start.log"
    steps, band = values["WARM_START_STEPS"], values["WARM_START_ACC"] != "last"
    _say(
        f"recipe: warm start (once): up to {steps} steps of verl's SFT trainer on the toy "
        f"demonstrations, WARM_START_ACC={values['WARM_START_ACC']} -> {warm} (log: {log})"
    )
    # a build killed mid-merge leaves merge.sh's hidden copy beside the model: replaced here
    for stale in (run, *warm.parent.glob(f".{warm.name}.merging-*")):
        shutil.rmtree(stale, ignore_errors=True)
    home.mkdir(parents=True, exist_ok=True)
    log.write_bytes(b"")
    env = {k: v for k, v in os.environ.items() if k not in BY_NAME}
    env.pop("VERL_USE_EXTERNAL_MODULES", None)
    env.update(WARM_START, DEVICE="gpu" if plan.train_on == "gpu" else "cpu", DRY_RUN="0",
               MODEL_PATH=str(plan.tiny_model_dir), PYTHON=plan.python,
               SFT_TRAIN_FILE=str(toy / "warm_start/train.parquet"),
               SFT_TEST_FILE=str(toy / "warm_start/test.parquet"), TOTAL_TRAINING_STEPS=steps,
               SAVE_FREQ=str(SAVE_EVERY) if band else steps, TEST_FREQ=steps,
               MAX_CKPT_TO_KEEP="null" if band else "3", LOGGER="console,file",
               RUN_DIR=str(run))  # fmt: skip
    contents = "[model,hf_model]" if band else "[model,optimizer,extra]"
    _run(["bash", str(ROOT / "recipes/sft_qwen2.5-0.5b_gsm8k.sh"), "optim.lr_scheduler_type=cosine",
          "optim.min_lr_ratio=0.1", "optim.lr_warmup_steps_ratio=0",
          f"checkpoint.save_contents={contents}", f"trainer.seed={values.get('SEED', '0')}"],
         log, "the warm start's SFT run", env=env)  # fmt: skip
    picked = str(run)
    if band:
        done = _run([plan.python, "-m", "verl_gsm8k.warm_start", str(run), "--test-file",
                     str(toy / "rl/test.parquet"), "--band", values["WARM_START_ACC"],
                     "--max-new-tokens", values["MAX_RESPONSE_LENGTH"], "--record",
                     f"{warm}.pick.json"], log, "scoring the warm start's saves",
                    capture=True)  # fmt: skip
        picked = done.stdout.strip().splitlines()[-1]
        last = log.read_text(errors="replace").rstrip().splitlines()[-1]
        _say(f"recipe: {last} (the scores: {warm}.pick.json)")
    _run(["bash", str(ROOT / "scripts/merge.sh"), picked, str(warm), "--force"], log,
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
