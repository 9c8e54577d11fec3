"""python -m verl_gsm8k.launch: a recipe's launch, up to verl and back (docs/architecture.md)."""

import contextlib
import io
import os
import runpy
import sys
import tempfile
import time
from pathlib import Path

from verl_gsm8k.common.command_line import PREFIX, shell_line
from verl_gsm8k.common.launch_env import ENV_LAUNCH, ENV_RUN_DIR, new_launch_id
from verl_gsm8k.common.run_dir import console_log_path, metrics_path, unused_stamp
from verl_gsm8k.common.terminal import clean
from verl_gsm8k.guard import prune, stop
from verl_gsm8k.launch import outcome
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

Exit = SystemExit  # the launch stops with this status, its line said; main returns it


def say(line: str, err: bool = False) -> None:
    """A launcher line, control characters of what it quotes escaped."""
    text = "\n".join(clean(part) for part in line.split("\n"))
    print(text, file=sys.stderr if err else sys.stdout, flush=True)


def fail(line: str, code: int = 2) -> None:
    say(line, err=True)
    raise Exit(code)


def check(plan: Plan) -> None:
    """The knob checks, before anything slow: one line per bad value, exit 2."""
    lines = plan.problems()
    for line in lines:
        say(f"knobs: {line}", err=True)
    if lines:
        raise Exit(2)
    if plan.trainer == "sft" and plan.values.get("NNODES", "1") != "1":
        fail(f"recipe: NNODES={plan.values['NNODES']}: the SFT recipe trains on one node "
             "(torchrun --standalone); set NDEVICES_PER_NODE for more devices")  # fmt: skip
    if ignored := plan.ignored():
        say(f"recipe: ignoring {' '.join(ignored)}: not knobs of verl's {plan.trainer.upper()} "
            "trainer (docs/knobs.md)", err=True)  # fmt: skip


def warn_unshared_run_dir(plan: Plan) -> None:
    """Several nodes and a RUN_DIR local to each: a warning."""
    nnodes, run_dir = plan.values.get("NNODES", "1"), f"{plan.run_dir}/"
    if not nnodes.isdigit() or int(nnodes) <= 1:
        return
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
    overridden = {split_override(item)[0] for item in user}
    for name in ("MODEL_PATH", "CRITIC_MODEL_PATH"):
        value = plan.values.get(name) or ""
        keys = {key for key, knob in plan.knob_keys.items() if knob == name}
        local = value.startswith(("/", "./", "../", "~"))
        if keys and not keys & overridden and local and not Path(value).expanduser().exists():
            fail(f"recipe: {name}={value} does not exist: a local directory holding the "
                 "model's config.json and weights, or a hub id such as "
                 "Qwen/Qwen2.5-0.5B-Instruct")  # fmt: skip


def quiet(main, argv: list[str]) -> None:
    with contextlib.redirect_stdout(io.StringIO()):
        code = main(argv)
    if code:
        raise Exit(code)


def prepare_cpu_defaults(plan: Plan) -> None:
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
        sample = str(CONFIG_DIR.parent / "data_prep/sample")
        tools = ["--tools", plan.values["TOOLS"]] if plan.values.get("TOOLS") else []
        quiet(prepare, ["--source", sample, "--out-dir", data_dir, *tools])
    if model == plan.tiny_model_dir:
        say(f"recipe: CPU run of a TINY RANDOM model: the {plan.trainer.upper()} loop is real, "
            "its accuracy means nothing (docs/cpu.md).")  # fmt: skip


def preflight(plan: Plan, user: list[str], dry_run: bool) -> list[str]:
    """The preflight on the final overrides; the token budget it picks. DRY_RUN ends here."""
    from verl_gsm8k.preflight.cli import preflight as run_preflight

    budget, picked = None, []
    own = any("max_token_len_per_gpu=" in arg for arg in user)
    if plan.trainer == "ppo" and plan.values.get("TOKEN_BUDGET") == "auto" and not own:
        budget = Path(tempfile.mkstemp(prefix="token-budget.")[1])
    chosen = {key: f"{knob}={plan.values[knob]}" for key, knob in plan.knob_keys.items()
              if knob in plan.from_env}  # fmt: skip
    chosen.update({split_override(item)[0]: item for item in user})
    try:
        code = run_preflight(plan.trainer, plan.recipe.config, plan.all_overrides(user),
                             CONFIG_DIR, budget, chosen)  # fmt: skip
        if code:
            raise Exit(code)
        if budget is not None:
            picked = [line for line in budget.read_text().splitlines() if line]
    finally:
        if budget is not None:
            budget.unlink(missing_ok=True)
    if dry_run:
        raise Exit(show_dry_run(plan, plan.all_overrides(user, picked)))
    return picked


def show_dry_run(plan: Plan, overrides: list[str]) -> int:
    """DRY_RUN=1's end: the command, then verl's entry point with ``--cfg job``."""
    say(f"{PREFIX}{shell_line(verl_argv(plan, overrides), plan.exports)}")
    sys.argv = [plan.verl_module, "--config-path", str(CONFIG_DIR), "--config-name",
                plan.recipe.config, "--cfg", "job", *overrides]  # fmt: skip
    try:
        runpy.run_module(plan.verl_module, run_name="__main__", alter_sys=True)
    except SystemExit as done:  # Hydra ends --cfg job with sys.exit
        return done.code if isinstance(done.code, int) else int(done.code is not None)
    return 0


def verl_argv(plan: Plan, overrides: list[str]) -> list[str]:
    launcher = [plan.python]
    if plan.trainer == "sft":
        launcher += ["-m", "torch.distributed.run", "--standalone", "--nnodes=1",
                     f"--nproc_per_node={plan.values['NDEVICES_PER_NODE']}"]  # fmt: skip
    return [*launcher, "-m", plan.verl_module, "--config-path", str(CONFIG_DIR), "--config-name",
            plan.recipe.config, *overrides]  # fmt: skip


def check_gpu(plan: Plan) -> None:
    none_here = plan.train_on == "gpu" and not has_gpu(plan.env) and not plan.on_ray_cluster()
    if plan.train_on != "none" and not none_here:
        return
    name, cluster = plan.recipe.name, ""
    here = f"bash recipes/smoke_tiny.sh, or DEVICE=cpu bash recipes/{name}.sh"
    if plan.trainer == "sft":
        here = f"DEVICE=cpu bash recipes/{name}.sh"
    if (address := plan.env.get("RAY_ADDRESS")) and plan.trainer == "ppo":
        cluster = f" To train on the GPUs of the Ray cluster at RAY_ADDRESS={address}: DEVICE=gpu."
    fail("recipe: preflight passed, but no NVIDIA GPU is visible here. To train on this CPU at "
         f"toy scale: {here}; DRY_RUN=1 prints the final config.{cluster}", 3)  # fmt: skip


def plan_stop(plan: Plan) -> tuple[int, dict[str, str]]:
    """(STOP_GRACE_S, verl's variables) of a PPO launch."""
    from verl_gsm8k.launch.slurm import job_end, kill_wait_line

    timings = stop.Timings.read(plan.run_dir)
    if fits := kill_wait_line(plan.env, timings.stop_needs()):
        say(fits, err="NOT fit" in fits)
    end, job = job_end(plan.env), plan.env.get("SLURM_JOB_ID")
    if end is None and job:
        say(f"recipe: Slurm job {job} has no end time (no time limit): no deadline")
    if end is not None:
        code, line = stop.fits(plan.run_dir, end, time.time())
        say(line, err=bool(code))
        if code:
            raise Exit(code)
        if not plan.env.get("STOP_GRACE_S"):  # a SIGTERM's grace runs to the job's end
            return int(stop.DEFAULT_GRACE_S), {stop.ENV_JOB_END: str(end)}
    try:
        grace, said = stop.grace(timings, plan.env)
    except ValueError as error:
        fail(str(error))
    for line in said:
        say(line, err=line.startswith("recipe: warning:"))
    return int(grace), {stop.ENV_JOB_END: str(end)} if end else {}


def say_where_wandb_logs(plan: Plan) -> None:
    wandb_dir = Path(plan.exports["WANDB_DIR"])
    wandb_dir.mkdir(parents=True, exist_ok=True)
    mode, runs = plan.env.get("WANDB_MODE", ""), f"{wandb_dir}/wandb/offline-run-*"
    if mode == "offline":
        say(f"recipe: wandb offline: this run is logged under {runs}; upload it later with: "
            f"wandb sync {runs}")  # fmt: skip
    elif mode == "disabled":
        say("recipe: wandb disabled (WANDB_MODE=disabled): nothing is logged to wandb")
    elif not plan.env.get("WANDB_API_KEY") and not (Path.home() / ".netrc").exists():
        say("recipe: LOGGER has wandb but no WANDB_API_KEY (and no wandb login): wandb will fail "
            "to start; WANDB_MODE=offline logs locally with no key and no network",
            err=True)  # fmt: skip


def record(plan: Plan, stamp: str, user: list[str], picked: list[str], command: str) -> None:
    from verl_gsm8k.resume.__main__ import record_launch

    code = record_launch(
        plan.run_dir, stamp, plan.recipe.name, plan.trainer, plan.recipe.config,
        plan.all_overrides(user, picked), resume=plan.values.get("RESUME", "auto"),
        knobs=dict(plan.values), knob_keys=dict(plan.knob_keys), user=user, verl_command=command,
        config_dir=CONFIG_DIR,
    )  # fmt: skip
    if code:
        raise Exit(code)


def train(plan: Plan, user: list[str], picked: list[str], start: float) -> int:
    """From the lock to the requeue; the launch's exit status."""
    from verl_gsm8k.launch.lock import Busy, lock_run_dir
    from verl_gsm8k.launch.slurm import requeue_if_stopped

    run_dir, ppo = plan.run_dir, plan.trainer == "ppo"
    stamp = unused_stamp(run_dir)
    try:
        lock_run_dir(run_dir, stamp, int(plan.values.get("LOCK_WAIT_S", "0")), say)
    except Busy as busy:
        if str(busy):
            say(str(busy), err=True)
        raise Exit(2) from None
    grace, extra = int(plan.env.get("STOP_GRACE_S") or stop.DEFAULT_GRACE_S), {}
    if ppo:
        grace, extra = plan_stop(plan)
        say(plan.save_every_line)
    # one metrics file per launch: verl's file logger truncates its file on open
    metrics, console = metrics_path(run_dir, stamp), console_log_path(run_dir, stamp)
    # every process verl starts carries these: what is left once verl ended is reaped
    launch_id = new_launch_id(stamp)
    launch_vars = {ENV_LAUNCH: launch_id, ENV_RUN_DIR: str(run_dir), "STOP_GRACE_S": str(grace),
                   "VERL_FILE_LOGGER_PATH": str(metrics), **extra}  # fmt: skip
    ray_env = ray_env_overrides(launch_vars) if plan.env.get("RAY_ADDRESS") and ppo else []
    argv = verl_argv(plan, [*plan.all_overrides([], picked), *ray_env, *user])
    command = shell_line(argv, {**plan.exports, **launch_vars})
    say(f"{PREFIX}{command}")
    record(plan, stamp, user, picked, command)
    if plan.logs_to_wandb():
        say_where_wandb_logs(plan)
    for path in (metrics, console):
        path.parent.mkdir(parents=True, exist_ok=True)
    say(f"recipe: metrics -> {metrics} | console log -> {console}")
    say(f"recipe: verl starts, {time.monotonic() - start:.1f} s after the launch began")
    supervisor = Supervisor(run_dir, grace, plan.env, say)
    env = {**plan.env, **plan.exports, **launch_vars}
    code = supervisor.run(argv, env, console, ppo, launch_id)
    if code == 0:
        prune_finished(run_dir, plan.values.get("MAX_CKPT_TO_KEEP", ""))
    report = f"Report: python -m verl_gsm8k.report {run_dir}" if ppo else (
        f"Metrics: {metrics}; to a Hugging Face model (a MODEL_PATH for the PPO recipes): bash "
        f"scripts/merge.sh {run_dir} OUT_DIR")  # fmt: skip
    say(f"recipe: verl exited with {code}. {report}")
    code, lines = outcome.verdict(run_dir, stamp, code, supervisor.signalled)
    failed = outcome.failed_groups(run_dir, stamp) if ppo else None
    for line in [*([failed] if failed else []), *lines]:
        say(line, err=True)
    if (hooks := recipe_hooks(plan.recipe)) is not None:
        hooks.after(plan, code)
    requeue_if_stopped(code, stamp, run_dir, plan.env, say)
    return code


def prune_finished(run_dir: Path, keep: str) -> None:
    if keep.isdigit() and int(keep) > 0:
        for line in prune.prune(run_dir, int(keep)):
            say(f"recipe: {line}")


def launch(argv: list[str]) -> int:
    recipe, user = parse_recipe(argv)
    if user[:1] in (["-h"], ["--help"]):
        print(f"usage: [KNOB=value ...] bash recipes/{recipe.name}.sh [verl.key=value ...]\n"
              "Knobs and their verl keys: docs/knobs.md. Extra key=value arguments override "
              "everything.\nDRY_RUN=1 runs the preflight and prints the final config without a "
              "GPU.")  # fmt: skip
        return 0
    start = time.monotonic()
    plan = make_plan(recipe, os.environ, probe=False, user=user)
    check(plan)  # before the attention probe imports torch
    probe_attention(plan)
    if plan.attention_refusal:
        fail(plan.attention_refusal)
    os.environ.update(plan.exports)
    where = f" on the Ray cluster at RAY_ADDRESS={plan.env['RAY_ADDRESS']}" if (
        plan.on_ray_cluster()) else ""  # fmt: skip
    say(f"recipe: {recipe.name} | config: configs/{recipe.config}.yaml | model: "
        f"{plan.values['MODEL_PATH']} | run dir: {plan.run_dir}")  # fmt: skip
    say(f"recipe: device: {plan.train_on} (DEVICE={plan.values.get('DEVICE', 'auto')}){where} | "
        f"attention: {plan.attention_line}")  # fmt: skip
    taken = {name: value for name, value in plan.values.items() if name in plan.from_env}
    shown = shell_line([], taken) if taken else "none (the recipe's and the table's defaults)"
    say(f"recipe: knobs from the environment: {shown}")  # secrets masked
    warn_unshared_run_dir(plan)
    if plan.train_on == "cpu":
        prepare_cpu_defaults(plan)
    if (hooks := recipe_hooks(plan.recipe)) is not None:
        hooks.prepare(plan)
    check_local_models(plan, user)
    dry_run = plan.values.get("DRY_RUN") == "1"
    picked: list[str] = []
    if plan.values.get("SKIP_PREFLIGHT") != "1":
        picked = preflight(plan, user, dry_run)
    elif dry_run:
        return show_dry_run(plan, plan.all_overrides(user))
    check_gpu(plan)
    return train(plan, user, picked, start)


def main(argv: list[str] | None = None) -> int:
    try:
        return launch(list(sys.argv[1:] if argv is None else argv))
    except Exit as done:
        return done.code
    except KeyboardInterrupt:
        return 130
