"""A launch's plan, made without side effects: every knob's value, the device and attention, the
environment verl's processes get, and the Hydra override list in the order verl reads it.

    recipe args (recipes/*.sh, before --)    --recipe NAME --config CONFIG [--trainer sft]
                                             [--cpu-by-default] [--hooks learn_tiny]
                                             NAME=VALUE (a knob's default for this recipe)
                                             a.verl.key=value (the recipe's own override)
    user args (after --)                     key=value, passed to verl last

A knob's value: the environment (a non-empty variable), else the recipe's hooks, else the
recipe's NAME=VALUE, else the table's default (knobs.py), else its rule (below). The override list:
the device and attention overlays, every knob's key(s), the recipe's own overrides, then (added by
the launch) the token budget the preflight picks, then the user's.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from verl_gsm8k.common import gpus
from verl_gsm8k.launch import save_every
from verl_gsm8k.launch.knobs import BY_NAME, CONFIG_DIR, KNOBS, hydra_quote, recipe_arguments
from verl_gsm8k.preflight.compose import split_override

ROOT = CONFIG_DIR.parent
# PPO: verl's own entry (its trainer is ours through verl's registry, verl_gsm8k/ppo_trainer/);
# SFT: verl's entry with our trainer class (verl_gsm8k/sft_trainer/: it has no registry).
VERL_MODULES = {"ppo": "verl.trainer.main_ppo", "sft": "verl_gsm8k.sft_trainer"}
# The variables a Ray cluster started by hand gets through the job (ray_env_overrides).
RAY_ENV_VARS = (
    "VERL_USE_EXTERNAL_MODULES", "ATTENTION", "VERL_PLATFORM", "VERL_ENGINE_DEVICE",
    "VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND", "WANDB_MODE", "WANDB_DIR",
)  # fmt: skip


@dataclass
class Recipe:
    name: str
    config: str  # configs/<config>.yaml
    trainer: str = "ppo"
    cpu_by_default: bool = False  # no GPU and DEVICE=auto: train on the CPU instead of stopping
    hooks: str = ""  # a module of verl_gsm8k.launch with defaults/prepare/after (learn_tiny)
    settings: dict[str, str] = field(default_factory=dict)  # knob defaults of this recipe
    overrides: list[str] = field(default_factory=list)  # the recipe's own verl overrides


def parse_recipe(argv: list[str]) -> tuple[Recipe, list[str]]:
    """(the recipe, the user's key=value arguments) from the launcher's command line."""
    cut = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(
        prog="python -m verl_gsm8k.launch",
        usage="%(prog)s --recipe NAME --config CONFIG [options] [NAME=VALUE | key=value ...] -- "
        "[key=value ...]",
        description="A recipe's whole launch, up to verl and back (docs/architecture.md, "
        '"One launch, hop by hop"). The recipe files of recipes/ run it; every knob is an '
        "environment variable (docs/knobs.md). After --: the user's key=value overrides, "
        "passed to verl last (--help there prints the recipe's usage).",
    )
    parser.add_argument("--recipe", required=True, help="the recipe's name (recipes/NAME.sh)")
    parser.add_argument("--config", required=True, help="its config, configs/CONFIG.yaml")
    parser.add_argument(
        "--trainer", choices=tuple(VERL_MODULES), default="ppo",
        help="verl's trainer: ppo (main_ppo, Ray; the default) or sft (its SFT trainer, torchrun)",
    )  # fmt: skip
    parser.add_argument(
        "--cpu-by-default", action="store_true",
        help="DEVICE=auto without a GPU trains on the CPU instead of stopping after the preflight",
    )  # fmt: skip
    parser.add_argument(
        "--hooks", default="",
        help="a module of verl_gsm8k.launch with the recipe's defaults/prepare/after (learn_tiny)",
    )  # fmt: skip
    parser.add_argument(
        "settings", nargs="*", metavar="NAME=VALUE | key=value",
        help="NAME=VALUE: the recipe's default for a knob of the table (the environment wins); "
        "key=value: a verl key the recipe sets, before the user's",
    )  # fmt: skip
    args = parser.parse_args(argv[:cut])
    recipe = Recipe(args.recipe, args.config, args.trainer, args.cpu_by_default, args.hooks)
    for item in args.settings:
        name, sep, value = item.partition("=")
        if not sep:
            parser.error(f"recipe setting {item!r}: not NAME=VALUE or key=value")
        if name in BY_NAME:
            recipe.settings[name] = value
        else:
            recipe.overrides.append(item)
    return recipe, argv[cut + 1 :]


def has_gpu(env: Mapping[str, str] | None = None) -> bool:
    """Whether the nvidia-smi on ``env``'s PATH lists a GPU (common/gpus.py)."""
    return bool(gpus.listed((env if env is not None else os.environ).get("PATH")))


@dataclass
class Plan:
    recipe: Recipe
    env: Mapping[str, str]  # the launcher's environment, as given
    values: dict[str, str]  # every knob's value
    from_env: set[str]  # the knobs the environment set
    train_on: str  # gpu, cpu or none
    tiny_model_dir: Path
    attention: str = "sdpa"
    attention_line: str = ""
    attention_refusal: str = ""
    use_sample_data: bool = False
    data_home: Path = Path()
    exports: dict[str, str] = field(default_factory=dict)  # the environment verl's processes get
    device_overrides: list[str] = field(default_factory=list)
    overrides: list[str] = field(default_factory=list)  # every knob's keys
    knob_keys: dict[str, str] = field(default_factory=dict)  # verl key -> the knob that set it
    extra: dict[str, str] = field(default_factory=dict)  # what hooks keep for later (learn_tiny)
    save_every_line: str = ""  # SAVE_EVERY_MIN's interval, said at launch (PPO)

    @property
    def trainer(self) -> str:
        return self.recipe.trainer

    @property
    def run_dir(self) -> Path:
        return Path(self.values["RUN_DIR"])

    @property
    def verl_module(self) -> str:
        return VERL_MODULES[self.trainer]

    def on_ray_cluster(self) -> bool:
        """DEVICE=gpu with RAY_ADDRESS (PPO): the GPUs are the cluster's, and the launching node
        (a KubeRay head, a `ray job submit` entrypoint) may have none."""
        return (
            bool(self.env.get("RAY_ADDRESS")) and self.trainer == "ppo" and (self.train_on == "gpu")
        )

    def all_overrides(self, user: list[str], picked: list[str] = ()) -> list[str]:
        """The launch's whole override list, in verl's order."""
        return [*self.device_overrides, *self.overrides, *self.recipe.overrides, *picked, *user]

    def ignored(self) -> list[str]:
        """Knobs of the other trainer set in the environment: ignored, and said so."""
        return [
            knob.name
            for knob in KNOBS
            if knob.name in self.from_env and self.trainer not in knob.trainers
        ]

    @property
    def python(self) -> str:
        """The interpreter verl and the recipe's own steps run with: PYTHON, else this one."""
        return self.env.get("PYTHON") or sys.executable

    def logs_to_wandb(self) -> bool:
        return "wandb" in self.values["LOGGER"].split(",")


class Values:
    """A knob's value while the plan is made: environment > hooks > recipe > table default."""

    def __init__(self, env: Mapping[str, str], recipe: Recipe) -> None:
        self.env, self.recipe = env, recipe
        self.hooked: dict[str, str] = {}

    def set_default(self, name: str, value: str) -> None:
        """A hook's default for ``name`` (the environment still wins)."""
        self.hooked[name] = value

    def get(self, name: str, fallback: str | None = None) -> str | None:
        if self.env.get(name):
            return self.env[name]
        for source in (self.hooked, self.recipe.settings):
            if name in source:
                return source[name]
        default = BY_NAME[name].default if name in BY_NAME else None
        return default if default is not None else fallback


def _absolute(path: str) -> str:
    return path if os.path.isabs(path) else os.path.join(os.getcwd(), path)


def _local_or_hub(path: str) -> str:
    """A model path may be a hub id (org/name): only an existing local path is made absolute."""
    return _absolute(path) if os.path.exists(path) else path


def _train_on(device: str, cpu_by_default: bool, gpu: Callable[[], bool]) -> str:
    if device in ("gpu", "cpu"):
        return device
    if device == "auto":
        if gpu():
            return "gpu"
        return "cpu" if cpu_by_default else "none"
    return "none"  # the knob check stops the launch with one line


def recipe_hooks(recipe: Recipe):
    """The module of the recipe's hooks (``--hooks NAME``: verl_gsm8k/launch/NAME.py), or None."""
    if not recipe.hooks:
        return None
    import importlib

    return importlib.import_module(f"verl_gsm8k.launch.{recipe.hooks}")


def user_value(user: Sequence[str], key: str) -> str | None:
    """The value the user's last ``key=value`` (or ``+key=``, ``++key=``) gives ``key``; a
    deletion (``~key``) gives none."""
    found = None
    for item in user:
        name, value = split_override(item)
        if "=" in item and not item.startswith("~") and name == key:
            found = value
    return found


def _resolve(
    values: Values, recipe: Recipe, train_on: str, tiny: Path, user: Sequence[str]
) -> dict[str, str]:
    """Every knob's value for this trainer (paths absolute: Ray's workers do not share the
    launch's working directory)."""
    env, trainer = values.env, recipe.trainer
    out = {
        knob.name: value
        for knob in KNOBS
        if trainer in knob.trainers and (value := values.get(knob.name)) is not None
    }
    if train_on == "cpu" and not env.get("MODEL_PATH") and "MODEL_PATH" not in values.hooked:
        out["MODEL_PATH"] = str(tiny)
    out["MODEL_PATH"] = _local_or_hub(out["MODEL_PATH"])
    if trainer == "sft" and not env.get("TOTAL_EPOCHS"):
        steps = env.get("TOTAL_TRAINING_STEPS", "")
        if steps.isdigit() and not steps.startswith("0"):
            out["TOTAL_EPOCHS"] = steps  # verl's SFT loop stops at the epochs first
    files = ("GSM8K_TRAIN_FILE", "GSM8K_TEST_FILE") if trainer == "ppo" else (
        "SFT_TRAIN_FILE", "SFT_TEST_FILE")  # fmt: skip
    data_dir = out["DATA_DIR"]
    out[files[0]] = _absolute(values.get(files[0]) or f"{data_dir}/train.parquet")
    out[files[1]] = _absolute(values.get(files[1]) or f"{data_dir}/test.parquet")
    if trainer == "ppo":
        out["CRITIC_MODEL_PATH"] = _local_or_hub(
            values.get("CRITIC_MODEL_PATH") or out["MODEL_PATH"]
        )
        out["REWARD_FILE"] = _absolute(values.get("REWARD_FILE") or str(ROOT / "rewards/gsm8k.py"))
    out["EXPERIMENT_NAME"] = values.get("EXPERIMENT_NAME") or recipe.name
    out["RUNS_ROOT"] = values.get("RUNS_ROOT") or str(ROOT / "runs")
    out["RUN_DIR"] = _absolute(
        values.get("RUN_DIR") or f"{out['RUNS_ROOT']}/{out['EXPERIMENT_NAME']}"
    )
    # auto: a fifth of the response length verl gets (the knob's, or a key=value after --)
    length = user_value(user, "data.max_response_length") or out.get("MAX_RESPONSE_LENGTH", "")
    if out.get("OVERLONG_BUFFER_LEN") == "auto" and length.isdigit():
        out["OVERLONG_BUFFER_LEN"] = str(max(1, int(length) // 5))
    if not out.get("LOGGER"):
        out["LOGGER"] = "console,file" + (",wandb" if env.get("WANDB_API_KEY") else "")
    return out


def make_plan(
    recipe: Recipe,
    env: Mapping[str, str],
    gpu: Callable[[], bool] | None = None,
    probe: bool = True,
    user: Sequence[str] = (),
) -> Plan:
    """The plan of ``recipe`` in ``env`` with the user's key=value arguments ``user`` (read
    where a knob's rule follows a key they set). ``probe``: ask this machine which attention it
    runs (imports torch); False takes sdpa (tests and tables that only want the override list)."""
    values = Values(env, recipe)
    gpu = gpu or (lambda: has_gpu(env))
    train_on = _train_on(values.get("DEVICE") or "auto", recipe.cpu_by_default, gpu)
    cache = values.get("CACHE_DIR") or os.path.join(
        env.get("XDG_CACHE_HOME") or os.path.join(env.get("HOME", "~"), ".cache"), "verl-gsm8k"
    )
    values.hooked["CACHE_DIR"] = cache
    tiny = Path(cache) / "tiny-qwen2"
    hooks = recipe_hooks(recipe)
    extra: dict[str, str] = {}
    if hooks is not None:
        hooks.defaults(values, extra)
    home = Path(env.get("HOME", "~"))
    data_home = home / "data" / ("gsm8k" if recipe.trainer == "ppo" else "gsm8k-sft")
    sample = Path(cache) / ("gsm8k-sample" if recipe.trainer == "ppo" else "gsm8k-sft-sample")
    train_file = values.get("GSM8K_TRAIN_FILE" if recipe.trainer == "ppo" else "SFT_TRAIN_FILE")
    use_sample = (
        not values.get("DATA_DIR") and not train_file and train_on == "cpu"
        and not (data_home / "train.parquet").exists()
    )  # fmt: skip
    values.hooked.setdefault("DATA_DIR", str(sample if use_sample else data_home))
    plan = Plan(
        recipe, env, _resolve(values, recipe, train_on, tiny, user), {k for k in env if env[k]},
        train_on, tiny, use_sample_data=use_sample, data_home=data_home, extra=extra,
    )  # fmt: skip
    plan.from_env &= set(BY_NAME)
    _save_every(plan)
    _device(plan, probe)
    _knob_overrides(plan)
    return plan


def _save_every(plan: Plan) -> None:
    """SAVE_EVERY_MIN's minutes for the trainer (auto: from the saves measured in the run
    directory) and the line that says them; a bad value is left to the knob check's one line."""
    value = plan.values.get("SAVE_EVERY_MIN")
    if value is None or not BY_NAME["SAVE_EVERY_MIN"].check.ok(value):
        return
    minutes, plan.save_every_line = save_every.choose(plan.run_dir, value)
    if value == "auto":
        plan.values["SAVE_EVERY_MIN"] = f"{minutes:g}"


def probe_attention(plan: Plan) -> None:
    """The plan's attention asked of this machine (imports torch): its overlays, plugins and line
    made again with the machine's choice."""
    plan.device_overrides.clear()
    plan.exports.clear()
    _device(plan, True)


def _device(plan: Plan, probe: bool) -> None:
    """The attention and device overlays, the modules verl loads in every process, and the
    environment a CPU run needs."""
    env, exports, on_cpu = plan.env, plan.exports, plan.train_on == "cpu"
    suffix = "_sft" if plan.trainer == "sft" else ""
    exports["ATTENTION"] = plan.values.get("ATTENTION", "auto")
    # every checkpoint file verl loads is checked in the process that loads it
    modules = ["verl_gsm8k.verl_plugins.checked_load"]
    choice_name, line = "sdpa", "sdpa (not probed)"
    if probe:
        from verl_gsm8k.common.attention import AttentionRefused
        from verl_gsm8k.common.attention import probe as probe_attention

        try:
            choice = probe_attention(exports["ATTENTION"], on_cpu)
            choice_name, line = choice.name, choice.line()
        except AttentionRefused as refused:
            plan.attention_refusal = f"attention: {refused}"
            line = f"refused ({plan.attention_refusal})"
    plan.attention, plan.attention_line = choice_name, line
    # fa2 runs verl's own configs; the others add their overlay and the plugin that gives the
    # critic (hard-coded flash_attention_2 in verl 0.9.1) the same attention
    if choice_name != "fa2":
        plan.device_overrides.append(f"+attention={choice_name}{suffix}")
        modules.append("verl_gsm8k.verl_plugins.attention_fallback")
    if on_cpu:
        plan.device_overrides.append(f"+device=cpu{suffix}")
        modules.append("verl_gsm8k.verl_plugins.cpu_platform")
        # One compute thread per process: a CPU run's processes share the cores, and torch's
        # default of a thread per core in each makes them wait on each other (docs/cpu.md,
        # "Threads"). On a machine with cores to spare, set OMP_NUM_THREADS yourself.
        exports["OMP_NUM_THREADS"] = env.get("OMP_NUM_THREADS") or "1"
        exports["VERL_PLATFORM"] = "cpu"  # verl's platform registry: verl_plugins/cpu_platform.py
        exports["VERL_ENGINE_DEVICE"] = "cuda"  # verl registers its FSDP engines for cuda/npu only
        if plan.trainer == "ppo":
            exports["VLLM_CPU_KVCACHE_SPACE"] = env.get("VLLM_CPU_KVCACHE_SPACE") or "1"  # GiB
            exports["VLLM_CPU_OMP_THREADS_BIND"] = env.get("VLLM_CPU_OMP_THREADS_BIND") or "nobind"
            # Ray starts one idle Python worker per logical CPU in advance: 16 imports, 2 cores
            for name in ("RAY_enable_worker_prestart", "RAY_prestart_worker_first_driver"):
                exports[name] = env.get(name) or "0"
    if plan.trainer == "ppo":
        modules.append("verl_gsm8k.verl_plugins.register_trainer")  # ppo_trainer/
        modules.append("verl_gsm8k.verl_plugins.stop_on_sigterm")  # SIGTERM: a stop request
    if env.get("VERL_USE_EXTERNAL_MODULES"):
        modules.append(env["VERL_USE_EXTERNAL_MODULES"])
    exports["VERL_USE_EXTERNAL_MODULES"] = ",".join(modules)
    if plan.logs_to_wandb():  # wandb writes its local run under WANDB_DIR: the run directory
        exports["WANDB_DIR"] = env.get("WANDB_DIR") or str(plan.run_dir)
    if env.get("RAY_ADDRESS") and plan.trainer == "ppo":
        plan.device_overrides.append("+ray=attach")
        shared = {name: exports.get(name) or env.get(name) or "" for name in RAY_ENV_VARS}
        plan.device_overrides += ray_env_overrides(shared)


def ray_env_overrides(variables: Mapping[str, str]) -> list[str]:
    """On a Ray cluster started by hand (RAY_ADDRESS), verl's trainer and workers run in workers
    of `ray start`, not under the launcher: the job's runtime environment hands them these."""
    key = "+ray_kwargs.ray_init.runtime_env.env_vars"
    return [f"{key}.{name}={hydra_quote(value)}" for name, value in variables.items() if value]


def _knob_overrides(plan: Plan) -> None:
    """Every knob onto its verl key(s), once; the launch record keeps which knob set each key
    (the run comparison names it beside a key that differs)."""
    for knob in KNOBS:
        value = plan.values.get(knob.name)
        if value is None:
            continue
        for key in knob.keys(plan.trainer):
            plan.overrides.append(key.override(value))
            plan.knob_keys[key.path] = knob.name
    if plan.trainer == "ppo":
        # the recipes' trainer: verl's sync trainer, guarded and traced (verl_gsm8k/ppo_trainer/)
        plan.overrides.append("trainer.v1.trainer_mode=gsm8k")
    if plan.values.get("RESUME") == "disable":
        plan.overrides.append("trainer.resume_mode=disable")
        plan.knob_keys["trainer.resume_mode"] = "RESUME"


def recipe_plan(
    recipe_file: Path, env: Mapping[str, str], gpu: bool = False, user: Sequence[str] = ()
) -> Plan:
    """The plan a recipe file makes in ``env`` and the user's ``user`` arguments, without probing
    this machine: ``gpu`` says whether it has one, the attention is sdpa (for tests and the
    per-card table)."""
    recipe, _ = parse_recipe(recipe_arguments(recipe_file))
    return make_plan(recipe, env, gpu=lambda: gpu, probe=False, user=user)


def bare_overrides(
    config_name: str, env: Mapping[str, str], trainer: str = "ppo", cwd: Path | None = None
) -> list[str]:
    """The override list of a recipe with no settings of its own over ``config_name``, in ``env``
    (relative paths taken from ``cwd``): what the preflight's tests check."""
    import contextlib

    with contextlib.chdir(cwd or os.getcwd()):
        plan = make_plan(Recipe("preflight", config_name, trainer), env)
    return plan.all_overrides([])
