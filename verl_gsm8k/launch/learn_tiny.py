"""learn_tiny's hooks (recipes/learn_tiny.sh): the algorithm's config, the toy task, the warm start.

First use builds, and caches under CACHE_DIR/learn-tiny/v2[/hard]/seed$SEED:
  1. the toy task: single-digit sums in GSM8K's format (data_prep.arithmetic), then verl's RL
     parquet through the real path (data_prep.gsm8k);
  2. the warm start: verl's SFT trainer (recipes/sft_qwen2.5-0.5b_gsm8k.sh) on demonstrations that
     end with the "#### N" line in only part of the answers (docs/learning.md), its last step
     (WARM_START_ACC=last) or its first save whose greedy accuracy on the toy test split is in a
     band (python -m verl_gsm8k.warm_start), merged to a Hugging Face model (scripts/merge.sh).
The RL run starts from it; at its end the report prints validation accuracy at step 0 and last.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from verl_gsm8k.common.run_dir import new_stamp
from verl_gsm8k.launch.knobs import KNOBS
from verl_gsm8k.launch.plan import CONFIG_DIR, ROOT, Plan, Values

# Bump when the toy task or the warm start's recipe changes: a cache of an older one is not reused.
CACHE_VERSION = 2
# easy: sums up to 4 + 4 and a converged warm start (every algorithm reaches ~1.00: does it
# learn?); hard: sums up to 9 + 9 and a warm start stopped when its accuracy first reaches
# 0.30-0.45, which knows part of them (which learns best? bench.algorithms).
TOY = {  # TOY_TASK -> (largest operand, warm start's SFT steps, WARM_START_ACC, cache subfolder)
    "easy": (4, "400", "last", ""),
    "hard": (9, "300", "0.30-0.45", "hard/"),
}
SAVE_EVERY = 10  # SFT steps between the saves scored for a WARM_START_ACC band
# The warm start's SFT run: the toy demonstrations, 32 per step, a cosine learning rate from 3e-3
# down to 3e-4, so it ends converged (docs/learning.md, "Why sums were lost").
WARM_START = {"SFT_LR": "3e-3", "TRAIN_BATCH_SIZE": "32", "MAX_LENGTH": "160"}


def defaults(values: Values, extra: dict[str, str]) -> None:
    """The algorithm's config, the toy task's defaults, the warm start as MODEL_PATH."""
    algo = values.get("ALGO") or "ppo"
    if (CONFIG_DIR / f"gsm8k_{algo}.yaml").is_file():  # else the knob check says why
        values.recipe.config = f"gsm8k_{algo}"
    toy = TOY.get(values.get("TOY_TASK") or "easy", TOY["easy"])
    values.set_default("WARM_START_STEPS", toy[1])
    values.set_default("WARM_START_ACC", toy[2])
    stamp = new_stamp()
    values.set_default("EXPERIMENT_NAME", f"learn_tiny_{algo}_{stamp}")  # a fresh run each time
    home = Path(values.get("CACHE_DIR") or ".", f"learn-tiny/v{CACHE_VERSION}",
                f"{toy[3]}seed{values.get('SEED') or '0'}").absolute()  # fmt: skip
    warm = f"warm-start-{values.get('WARM_START_STEPS')}"
    if values.get("WARM_START_ACC") != "last":
        warm += f"-acc{values.get('WARM_START_ACC')}"
    extra.update(home=str(home), toy_dir=str(home / "data"), warm_start=str(home / warm),
                 max_operand=str(toy[0]))  # fmt: skip
    values.set_default("MODEL_PATH", str(home / warm))
    values.set_default("DATA_DIR", str(home / "data" / "rl"))
    if algo == "dapo":  # the overlong buffer: a fifth of the response length, as the paper's
        values.set_default("OVERLONG_BUFFER_LEN", "auto")


def _say(line: str, err: bool = False) -> None:
    print(line, file=sys.stderr if err else sys.stdout, flush=True)


def prepare(plan: Plan) -> None:
    """The toy data and the warm start, when missing."""
    extra, values = plan.extra, plan.values
    toy_dir = Path(extra["toy_dir"])
    warm = Path(extra["warm_start"])
    need_warm = values["MODEL_PATH"] == str(warm) and not (warm / "config.json").exists()
    uses_toy = values.get("DATA_DIR") == str(toy_dir / "rl")
    if (need_warm or uses_toy) and not (toy_dir / "rl" / "test.parquet").exists():
        operand, seed = extra["max_operand"], values.get("SEED", "0")
        _say(f"recipe: the toy task ({values.get('TOY_TASK', 'easy')}: sums up to {operand} + "
             f"{operand} in GSM8K's format, seed {seed}) -> {toy_dir}")  # fmt: skip
        from data_prep.arithmetic import main as arithmetic
        from data_prep.gsm8k import main as gsm8k
        from verl_gsm8k.launch.cli import quiet

        quiet(arithmetic, ["--out-dir", str(toy_dir), "--seed", seed, "--max-operand", operand])
        quiet(gsm8k, ["--source", str(toy_dir), "--out-dir", str(toy_dir / "rl")])
    if need_warm:
        build_warm_start(plan, toy_dir, warm)


def _sft_env(plan: Plan, run: Path, toy_dir: Path, band: bool) -> dict[str, str]:
    """The SFT recipe runs as a child with none of this run's knobs (they are the RL run's)."""
    env = {k: v for k, v in os.environ.items() if k not in {knob.name for knob in KNOBS}}
    env.pop("VERL_USE_EXTERNAL_MODULES", None)
    steps = plan.values["WARM_START_STEPS"]
    env.update(WARM_START, DEVICE="gpu" if plan.train_on == "gpu" else "cpu", DRY_RUN="0",
               MODEL_PATH=str(plan.tiny_model_dir),
               SFT_TRAIN_FILE=str(toy_dir / "warm_start/train.parquet"),
               SFT_TEST_FILE=str(toy_dir / "warm_start/test.parquet"),
               TOTAL_TRAINING_STEPS=steps, SAVE_FREQ=str(SAVE_EVERY) if band else steps,
               TEST_FREQ=steps, MAX_CKPT_TO_KEEP="null" if band else "3",
               LOGGER="console,file", RUN_DIR=str(run))  # fmt: skip
    if plan.env.get("PYTHON"):
        env["PYTHON"] = plan.env["PYTHON"]
    return env


def build_warm_start(plan: Plan, toy_dir: Path, warm: Path) -> None:
    from verl_gsm8k.launch.cli import Exit, quiet

    tiny = plan.tiny_model_dir
    if not (tiny / "config.json").exists():
        _say(f"recipe: building the tiny random Qwen2 (offline, once) -> {tiny}")
        from verl_gsm8k.common.tiny_model import main as build_tiny

        quiet(build_tiny, [str(tiny), "--force"])
    home = Path(plan.extra["home"])
    run, log = home / "warm-start-run", home / "warm-start.log"
    band = plan.values["WARM_START_ACC"] != "last"
    contents = "[model,hf_model]" if band else "[model,optimizer,extra]"
    _say(f"recipe: warm start (once): up to {plan.values['WARM_START_STEPS']} steps of verl's SFT "
         f"trainer on the toy demonstrations, WARM_START_ACC={plan.values['WARM_START_ACC']} -> "
         f"{warm} (log: {log})")  # fmt: skip
    # A build killed mid-merge leaves merge.sh's temporary copy beside the model (a hidden
    # .NAME.merging-* of a model's size): this build replaces it.
    shutil.rmtree(run, ignore_errors=True)
    for leftover in warm.parent.glob(f".{warm.name}.merging-*"):
        shutil.rmtree(leftover, ignore_errors=True)
    seed = plan.values.get("SEED", "0")
    argv = ["bash", str(ROOT / "recipes/sft_qwen2.5-0.5b_gsm8k.sh"),
            "optim.lr_scheduler_type=cosine", "optim.min_lr_ratio=0.1",
            "optim.lr_warmup_steps_ratio=0", f"checkpoint.save_contents={contents}",
            f"trainer.seed={seed}"]  # fmt: skip
    home.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as out:
        code = subprocess.run(argv, env=_sft_env(plan, run, toy_dir, band), stdout=out,
                              stderr=subprocess.STDOUT, check=False).returncode  # fmt: skip
    if code:
        _say(f"recipe: the warm start's SFT run failed; its log: {log}", err=True)
        raise Exit(1)
    picked = str(run)
    if band:
        with open(log, "ab") as err:
            done = subprocess.run(
                [plan.python, "-m", "verl_gsm8k.warm_start", str(run), "--test-file",
                 str(toy_dir / "rl/test.parquet"), "--band", plan.values["WARM_START_ACC"],
                 "--max-new-tokens", plan.values["MAX_RESPONSE_LENGTH"], "--record",
                 f"{warm}.pick.json"], stdout=subprocess.PIPE, stderr=err, text=True, check=False,
            )  # fmt: skip
        if done.returncode:
            _say(f"recipe: scoring the warm start's saves failed; its log: {log}", err=True)
            raise Exit(1)
        picked = done.stdout.strip().splitlines()[-1]
        last = log.read_text(errors="replace").rstrip().splitlines()[-1]
        _say(f"recipe: {last} (the scores: {warm}.pick.json)")
    with open(log, "ab") as out:
        merged = subprocess.run(
            ["bash", str(ROOT / "scripts/merge.sh"), picked, str(warm), "--force"],
            env={**os.environ, "PYTHON": plan.python}, stdout=out, stderr=subprocess.STDOUT,
            check=False,
        )  # fmt: skip
    if merged.returncode:
        _say(f"recipe: merging the warm start failed; its log: {log}", err=True)
        raise Exit(1)
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
