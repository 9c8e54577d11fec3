"""python -m verl_gsm8k.launch: a recipe's whole launch, in one process, up to verl and back.

    knobs -> overrides -> attention -> knob checks -> preflight (DRY_RUN=1: then verl's composed
    config, exit 0) -> run-directory lock -> Slurm deadline and stop grace -> same-config check and
    launch record -> verl (PPO: main_ppo, SIGTERM blocked, its own session; SFT: torchrun) ->
    supervised (SIGTERM: a stop request; the grace; Ctrl-C) -> what outlives verl reaped -> how
    the launch ended (the exit status) -> pruning -> the Slurm requeue.

A recipe file (recipes/*.sh) runs it as ``exec python -m verl_gsm8k.launch RECIPE-ARGS -- "$@"``
(plan.py says what a recipe passes). Exit statuses (docs/reliability.md): 0 done, 1 the preflight
failed, 2 bad input (a knob, a busy run directory, a refused resume), 3 no GPU here, 4 the
watchdog stopped the run, 5 stopped on SIGTERM or before a job's end after saving, else verl's.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

from verl_gsm8k.common.command_line import PREFIX, shell_line
from verl_gsm8k.common.launch_env import ENV_LAUNCH, ENV_RUN_DIR, new_launch_id
from verl_gsm8k.common.run_dir import console_log_path, deadline_path, metrics_path, unused_stamp
from verl_gsm8k.common.terminal import clean
from verl_gsm8k.guard import deadline as job_deadline
from verl_gsm8k.guard import prune
from verl_gsm8k.launch import grace as stop_grace
from verl_gsm8k.launch import outcome
from verl_gsm8k.launch.knobs import problems
from verl_gsm8k.launch.plan import (
    CONFIG_DIR,
    Plan,
    has_gpu,
    make_plan,
    parse_recipe,
    probe_attention,
    ray_env_overrides,
    recipe_hooks,
)
from verl_gsm8k.launch.supervise import Supervisor
from verl_gsm8k.preflight.compose import split_override


class Exit(Exception):
    """Stop the launch with this status (its line said already)."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def say(line: str, err: bool = False) -> None:
    """One of the launcher's lines; what it quotes from files (a run directory's messages,
    verl's log) has its control characters escaped, its own line breaks kept."""
    text = "\n".join(clean(part) for part in line.split("\n"))
    print(text, file=sys.stderr if err else sys.stdout, flush=True)


def usage(recipe: str) -> None:
    print(f"usage: [KNOB=value ...] bash recipes/{recipe}.sh [verl.key=value ...]")
    print("Knobs and their verl keys: docs/knobs.md. Extra key=value arguments override "
          "everything.")  # fmt: skip
    print("DRY_RUN=1 runs the preflight and prints the final config without a GPU.")


def check(plan: Plan) -> None:
    """The knob checks, before anything slow: one line per bad value, exit 2."""
    lines = problems(plan.values)
    for line in lines:
        say(f"knobs: {line}", err=True)
    if lines:
        raise Exit(2)
    if plan.trainer == "sft" and plan.values.get("NNODES", "1") != "1":
        say(f"recipe: NNODES={plan.values['NNODES']}: the SFT recipe trains on one node (torchrun "
            "--standalone); set NDEVICES_PER_NODE for more devices", err=True)  # fmt: skip
        raise Exit(2)
    ignored = plan.ignored()
    if ignored:
        label = plan.trainer.upper()
        say(f"recipe: ignoring {' '.join(ignored)}: not knobs of verl's {label} trainer "
            "(docs/knobs.md)", err=True)  # fmt: skip


def knobs_from_env_line(plan: Plan) -> str:
    """The knobs this launch took from the environment, as NAME=value words (secrets masked):
    a variable a shell exported for something else (DEVICE, SEED, LOGGER) shows here."""
    taken = {name: value for name, value in plan.values.items() if name in plan.from_env}
    shown = shell_line([], taken) if taken else "none (the recipe's and the table's defaults)"
    return f"recipe: knobs from the environment: {shown}"


def warn_unshared_run_dir(plan: Plan) -> None:
    """Every FSDP rank writes its shards to RUN_DIR on its own node (docs/scaling.md, "Where
    things land"): with several nodes RUN_DIR must be storage they all mount. /tmp is usually
    node-local, and Ray unpacks `ray job submit --working-dir` under <temp dir>/session_*/
    runtime_resources/, a cache it deletes."""
    nnodes = plan.values.get("NNODES", "1")
    if not nnodes.isdigit() or int(nnodes) <= 1:
        return
    run_dir = f"{plan.run_dir}/"
    if "/session_" in run_dir and "/runtime_resources/" in run_dir:
        why = "inside Ray's session directory (a working_dir copy Ray deletes)"
    elif run_dir.startswith("/tmp/"):
        why = "under /tmp, usually a node's local disk"
    else:
        return
    say(f"recipe: warning: NNODES={nnodes} and RUN_DIR={plan.run_dir} is {why}: every node "
        "writes its ranks' checkpoint shards there, and merge.sh and a resume need them all in "
        "one place; set RUNS_ROOT to storage every node mounts (docs/scaling.md)",
        err=True)  # fmt: skip


def check_local_models(plan: Plan, user: list[str]) -> None:
    """A model knob naming a local directory that does not exist: one line, exit 2, before the
    preflight imports verl (whose first words on it would be a hub-id error). A hub id, or a key
    the user sets after ``--``, is the preflight's to check."""
    overridden = {split_override(item)[0] for item in user}
    for name in ("MODEL_PATH", "CRITIC_MODEL_PATH"):
        value = plan.values.get(name)
        keys = [key for key, knob in plan.knob_keys.items() if knob == name]
        if not value or not keys or overridden & set(keys):
            continue
        if value.startswith(("/", "./", "../", "~")) and not Path(value).expanduser().exists():
            say(f"recipe: {name}={value} does not exist: a local directory holding the model's "
                "config.json and weights, or a hub id such as Qwen/Qwen2.5-0.5B-Instruct",
                err=True)  # fmt: skip
            raise Exit(2)


def prepare_cpu_defaults(plan: Plan) -> None:
    """First use on a CPU: build the tiny model and prepare the shipped GSM8K sample, if missing."""
    model = Path(plan.values["MODEL_PATH"])
    if model == plan.tiny_model_dir and not (model / "config.json").exists():
        say(f"recipe: building the tiny random Qwen2 (offline, once) -> {model}")
        from verl_gsm8k.common.tiny_model import main as build_tiny

        quiet(build_tiny, [str(model), "--force"])
    train = "GSM8K_TRAIN_FILE" if plan.trainer == "ppo" else "SFT_TRAIN_FILE"
    if plan.use_sample_data and not Path(plan.values[train]).exists():
        data_dir = plan.values["DATA_DIR"]
        say(f"recipe: no data prepared in {plan.data_home}: preparing the GSM8K sample shipped in "
            f"data_prep/sample -> {data_dir}")  # fmt: skip
        if plan.trainer == "ppo":
            from data_prep.gsm8k import main as prepare
        else:
            from data_prep.sft import main as prepare
        root = CONFIG_DIR.parent
        quiet(prepare, ["--source", str(root / "data_prep/sample"), "--out-dir", data_dir])
    if model == plan.tiny_model_dir:
        label = plan.trainer.upper()
        say(f"recipe: CPU run of a TINY RANDOM model: the {label} loop is real, its accuracy "
            "means nothing (docs/cpu.md).")  # fmt: skip


def quiet(main, argv: list[str]) -> None:
    """A stage's main in this process with its standard output silenced (its errors stay)."""
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()):
        code = main(argv)
    if code:
        raise Exit(code)


def preflight(plan: Plan, user: list[str], dry_run: bool) -> list[str]:
    """The preflight on the final override list, in this process; the token budget it picks
    (TOKEN_BUDGET=auto, PPO, no budget key among the user's overrides). DRY_RUN: then verl's own
    --cfg job, in the same process (verl imported once)."""
    budget = None
    own_budget = any("max_token_len_per_gpu=" in arg for arg in user)
    if plan.trainer == "ppo" and plan.values.get("TOKEN_BUDGET") == "auto" and not own_budget:
        budget = Path(tempfile.mkstemp(prefix="token-budget.")[1])
    from verl_gsm8k.preflight.cli import preflight as run_preflight

    chosen = {key: f"{knob}={plan.values[knob]}" for key, knob in plan.knob_keys.items()
              if knob in plan.from_env}  # fmt: skip
    chosen.update({split_override(item)[0]: item for item in user})
    try:
        code = run_preflight(plan.trainer, plan.recipe.config, plan.all_overrides(user),
                             CONFIG_DIR, None, budget, chosen)  # fmt: skip
        if code:
            raise Exit(code)
        picked = []
        if budget is not None and budget.stat().st_size:
            picked = [line for line in budget.read_text().splitlines() if line]
    finally:
        if budget is not None:
            budget.unlink(missing_ok=True)
    if dry_run:
        raise Exit(show_dry_run(plan, plan.all_overrides(user, picked)))
    return picked


def show_dry_run(plan: Plan, overrides: list[str]) -> int:
    """DRY_RUN=1's end: the command a launch would run, then verl's --cfg job of it, here."""
    from verl_gsm8k.preflight.dry_run import print_config

    say_command(verl_argv(plan, overrides), plan.exports)
    return print_config(plan.verl_module, CONFIG_DIR, plan.recipe.config, overrides)


def say_command(argv: list[str], env: dict[str, str]) -> str:
    """The exact command verl gets, said as one shell line (common/command_line.py); the line."""
    line = shell_line(argv, env)
    say(f"{PREFIX}{line}")
    return line


def no_gpu(plan: Plan) -> bool:
    if plan.train_on == "none":
        return True
    return plan.train_on == "gpu" and not has_gpu(plan.env) and not plan.on_ray_cluster()


def say_no_gpu(plan: Plan) -> None:
    name = plan.recipe.name
    here = f"bash recipes/smoke_tiny.sh, or DEVICE=cpu bash recipes/{name}.sh"
    if plan.trainer == "sft":
        here = f"DEVICE=cpu bash recipes/{name}.sh"
    cluster = ""
    address = plan.env.get("RAY_ADDRESS")
    if address and plan.trainer == "ppo":
        cluster = f" To train on the GPUs of the Ray cluster at RAY_ADDRESS={address}: DEVICE=gpu."
    say("recipe: preflight passed, but no NVIDIA GPU is visible here. To train on this CPU at toy "
        f"scale: {here}; DRY_RUN=1 prints the final config.{cluster}", err=True)  # fmt: skip


def plan_stop(plan: Plan) -> tuple[int, bool]:
    """(STOP_GRACE_S, set by the user) for this PPO launch, each said in one line; a Slurm job's
    end as the trainer's deadline (RUN_DIR/job_deadline), refused when start-up, a step and a
    save measured by earlier launches do not fit the time left."""
    from verl_gsm8k.guard.deadline import Timings
    from verl_gsm8k.launch.slurm import job_end, kill_wait_line

    run_dir = plan.run_dir
    given = plan.env.get("STOP_GRACE_S", "")
    deadline_path(run_dir).unlink(missing_ok=True)
    timings = Timings.read(run_dir)
    fits = kill_wait_line(plan.env, stop_grace.stop_needs(timings))
    if fits:
        say(fits, err="NOT fit" in fits)
    end = job_end(plan.env)
    if end is None and plan.env.get("SLURM_JOB_ID"):
        say(f"recipe: Slurm job {plan.env['SLURM_JOB_ID']} has no end time (no time limit): no "
            "deadline")  # fmt: skip
    if end is not None:
        code = job_deadline.plan_and_write(run_dir, end)
        if code:
            raise Exit(code)
        if not given:  # a stop gets until 5 s before the job's end (Supervisor.request_stop)
            return int(stop_grace.DEFAULT_S), False
    try:
        grace, said = stop_grace.choose(timings, {**plan.env, "STOP_GRACE_S": given})
    except ValueError as error:
        say(str(error), err=True)
        raise Exit(2) from None
    for line in said:
        say(line, err=line.startswith("recipe: warning:"))
    return int(grace), bool(given)


def record(plan: Plan, stamp: str, user: list[str], picked: list[str], command: str) -> None:
    """The same-config check, then RUN_DIR/launches/launch-<stamp>.yaml (verl_gsm8k/resume/),
    which keeps ``command``, the verl command line."""
    from verl_gsm8k.resume.__main__ import record_launch

    code = record_launch(
        plan.run_dir, stamp, plan.recipe.name, plan.trainer, plan.recipe.config,
        plan.all_overrides(user, picked), resume=plan.values.get("RESUME", "auto"),
        knobs=dict(plan.values), knob_keys=dict(plan.knob_keys), user=user, verl_command=command,
        config_dir=CONFIG_DIR,
    )  # fmt: skip
    if code:
        raise Exit(code)


def say_where_wandb_logs(plan: Plan) -> None:
    """wandb without a key: WANDB_MODE=offline logs under WANDB_DIR with no key and no network,
    for `wandb sync` later. The key itself is never printed."""
    wandb_dir = Path(plan.exports["WANDB_DIR"])
    wandb_dir.mkdir(parents=True, exist_ok=True)
    mode = plan.env.get("WANDB_MODE", "")
    if mode == "offline":
        runs = f"{wandb_dir}/wandb/offline-run-*"
        say(f"recipe: wandb offline: this run is logged under {runs}; upload it later with: "
            f"wandb sync {runs}")  # fmt: skip
    elif mode == "disabled":
        say("recipe: wandb disabled (WANDB_MODE=disabled): nothing is logged to wandb")
    elif not plan.env.get("WANDB_API_KEY") and not (Path.home() / ".netrc").exists():
        say("recipe: LOGGER has wandb but no WANDB_API_KEY (and no wandb login): wandb will fail "
            "to start; WANDB_MODE=offline logs locally with no key and no network",
            err=True)  # fmt: skip


def verl_argv(plan: Plan, overrides: list[str]) -> list[str]:
    python = plan.python
    if plan.trainer == "ppo":
        launcher = [python]
    else:  # one process per device (`python -m torch.distributed.run`, with this python)
        launcher = [python, "-m", "torch.distributed.run", "--standalone", "--nnodes=1",
                    f"--nproc_per_node={plan.values['NDEVICES_PER_NODE']}"]  # fmt: skip
    return [*launcher, "-m", plan.verl_module, "--config-path", str(CONFIG_DIR), "--config-name",
            plan.recipe.config, *overrides]  # fmt: skip


def train(plan: Plan, user: list[str], picked: list[str], start: float) -> int:
    """From the lock to the requeue: verl runs, supervised; the launch's exit status."""
    from verl_gsm8k.launch.lock import Busy, lock_run_dir
    from verl_gsm8k.launch.slurm import requeue_if_stopped

    run_dir = plan.run_dir
    stamp = unused_stamp(run_dir)
    try:
        lock_run_dir(run_dir, stamp, int(plan.values.get("LOCK_WAIT_S", "0")), say)
    except Busy as busy:
        if str(busy):
            say(str(busy), err=True)
        raise Exit(2) from None
    grace, grace_set = int(plan.env.get("STOP_GRACE_S") or stop_grace.DEFAULT_S), False
    if plan.trainer == "ppo":
        grace, grace_set = plan_stop(plan)
        say(plan.save_every_line)  # the minutes plan.py passed to the trainer
    # verl's file logger truncates its file on open: one file per launch keeps a resumed run's
    metrics, console = metrics_path(run_dir, stamp), console_log_path(run_dir, stamp)
    # Every process verl starts carries these two variables (Ray's included, which leave the
    # launcher's process group): once verl has ended, whatever is left of them is stopped.
    launch_id = new_launch_id(stamp)
    launch_vars = {ENV_LAUNCH: launch_id, ENV_RUN_DIR: str(run_dir),
                   "STOP_GRACE_S": str(grace), "VERL_FILE_LOGGER_PATH": str(metrics)}  # fmt: skip
    on_cluster = plan.env.get("RAY_ADDRESS") and plan.trainer == "ppo"
    ray_env = ray_env_overrides(launch_vars) if on_cluster else []
    env = {**plan.env, **plan.exports, **launch_vars}
    overrides = [*plan.all_overrides([], picked), *ray_env, *user]
    argv = verl_argv(plan, overrides)
    command = say_command(argv, {**plan.exports, **launch_vars})
    record(plan, stamp, user, picked, command)
    if plan.logs_to_wandb():
        say_where_wandb_logs(plan)
    for path in (metrics, console):
        path.parent.mkdir(parents=True, exist_ok=True)
    say(f"recipe: metrics -> {metrics} | console log -> {console}")
    say(f"recipe: verl starts, {time.monotonic() - start:.1f} s after the launch began")
    supervisor = Supervisor(run_dir, grace, grace_set, plan.env, say)
    code = supervisor.run(argv, env, console, plan.trainer == "ppo", launch_id)
    if code == 0:
        prune_finished(run_dir, plan.values.get("MAX_CKPT_TO_KEEP", ""))
    if plan.trainer == "ppo":
        say(f"recipe: verl exited with {code}. Report: python -m verl_gsm8k.report {run_dir}")
    else:
        say(
            f"recipe: verl exited with {code}. Metrics: {metrics}; to a Hugging Face model (a "
            f"MODEL_PATH for the PPO recipes): bash scripts/merge.sh {run_dir} OUT_DIR"
        )
    code, lines = outcome.verdict(run_dir, stamp, code, supervisor.deadline is not None)
    for line in lines:
        say(line, err=True)
    hooks = recipe_hooks(plan.recipe)
    if hooks is not None:
        hooks.after(plan, code)
    requeue_if_stopped(code, stamp, run_dir, plan.env, say)
    return code


def prune_finished(run_dir: Path, keep: str) -> None:
    """verl's max_*_ckpt_to_keep prunes only what the current process saved: after a launch that
    ended cleanly, the limit applies to the whole run directory, never removing the checkpoint a
    relaunch resumes from nor the kept best (verl_gsm8k/guard/prune.py)."""
    if keep.isdigit() and int(keep) > 0:
        for line in prune.prune(run_dir, int(keep)):
            say(f"recipe: {line}")


def launch(argv: list[str]) -> int:
    recipe, user = parse_recipe(argv)
    if user[:1] in (["-h"], ["--help"]):
        usage(recipe.name)
        return 0
    start = time.monotonic()
    plan = make_plan(recipe, os.environ, probe=False, user=user)
    check(plan)  # in well under a second, before the attention probe imports torch
    probe_attention(plan)
    if plan.attention_refusal:
        say(plan.attention_refusal, err=True)
        raise Exit(2)
    os.environ.update(plan.exports)  # the preflight, and every process started from here
    where = f" on the Ray cluster at RAY_ADDRESS={plan.env['RAY_ADDRESS']}" if (
        plan.on_ray_cluster()) else ""  # fmt: skip
    say(f"recipe: {recipe.name} | config: configs/{recipe.config}.yaml | model: "
        f"{plan.values['MODEL_PATH']} | run dir: {plan.run_dir}")  # fmt: skip
    say(f"recipe: device: {plan.train_on} (DEVICE={plan.values.get('DEVICE', 'auto')}){where} | "
        f"attention: {plan.attention_line}")  # fmt: skip
    say(knobs_from_env_line(plan))
    warn_unshared_run_dir(plan)
    if plan.train_on == "cpu":
        prepare_cpu_defaults(plan)
    hooks = recipe_hooks(plan.recipe)
    if hooks is not None:
        hooks.prepare(plan)
    check_local_models(plan, user)
    dry_run = plan.values.get("DRY_RUN") == "1"
    picked: list[str] = []
    if plan.values.get("SKIP_PREFLIGHT") != "1":
        picked = preflight(plan, user, dry_run)  # DRY_RUN: ends there, after verl's --cfg job
    elif dry_run:
        return show_dry_run(plan, plan.all_overrides(user))
    if no_gpu(plan):
        say_no_gpu(plan)
        return 3
    return train(plan, user, picked, start)


def main(argv: list[str] | None = None) -> int:
    try:
        return launch(list(sys.argv[1:] if argv is None else argv))
    except Exit as done:
        return done.code
    except KeyboardInterrupt:
        return 130
