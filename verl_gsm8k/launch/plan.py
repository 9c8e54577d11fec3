"""A launch's plan, without side effects: knob values, device, attention, verl's environment
and overrides."""

import argparse
import contextlib
import importlib
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from verl_gsm8k.common import gpus
from verl_gsm8k.launch import save_every
from verl_gsm8k.launch.knobs import (
    BY_NAME,
    CONFIG_DIR,
    KNOBS,
    hydra_quote,
    problems,
    recipe_arguments,
)
from verl_gsm8k.preflight.compose import split_override
from verl_gsm8k.tools import TURNS

ROOT = CONFIG_DIR.parent
VERL_MODULES = {"ppo": "verl.trainer.main_ppo", "sft": "verl_gsm8k.sft_trainer"}
# VERL_USE_EXTERNAL_MODULES of a PPO launch on the CPU; _device leaves out what others need not.
VERL_PLUGINS = tuple(f"verl_gsm8k.verl_plugins.{name}" for name in (
    "checked_load", "attention_fallback", "cpu_platform", "register_trainer", "stop_on_sigterm",
    "weight_socket",
))  # fmt: skip
# What a Ray cluster started by hand gets through the job.
RAY_ENV_VARS = ("VERL_USE_EXTERNAL_MODULES", "ATTENTION", "VERL_PLATFORM", "VERL_ENGINE_DEVICE",
                "VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND", "WANDB_MODE",
                "WANDB_DIR")  # fmt: skip


@dataclass
class Recipe:
    name: str
    config: str  # configs/<config>.yaml
    trainer: str = "ppo"
    cpu_by_default: bool = False
    hooks: str = ""  # a module of verl_gsm8k.launch with defaults/prepare/after
    settings: dict[str, str] = field(default_factory=dict)  # knob defaults
    overrides: list[str] = field(default_factory=list)


def parse_recipe(argv: list[str]) -> tuple[Recipe, list[str]]:
    cut = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(
        prog="python -m verl_gsm8k.launch", description="A recipe's whole launch, up to verl "
        "and back (docs/architecture.md). Knobs: environment variables (docs/knobs.md); after "
        "--, the user's key=value, passed to verl last.")  # fmt: skip
    parser.add_argument("--recipe", required=True, help="the recipe's name (recipes/NAME.sh)")
    parser.add_argument("--config", required=True, help="its config, configs/CONFIG.yaml")
    parser.add_argument("--trainer", choices=tuple(VERL_MODULES), default="ppo",
                        help="verl's trainer: ppo (main_ppo, Ray) or sft (torchrun)")  # fmt: skip
    parser.add_argument("--cpu-by-default", action="store_true",
                        help="DEVICE=auto without a GPU: train on the CPU, not stop")  # fmt: skip
    parser.add_argument("--hooks", default="",
                        help="verl_gsm8k.launch.HOOKS: defaults, prepare, after")  # fmt: skip
    parser.add_argument("settings", nargs="*", metavar="NAME=VALUE | key=value",
                        help="a knob's default for this recipe, or a verl key it sets")  # fmt: skip
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
    return bool(gpus.listed((os.environ if env is None else env).get("PATH")))


@dataclass
class Plan:
    recipe: Recipe
    env: Mapping[str, str]
    values: dict[str, str]
    from_env: set[str]  # the knobs the environment set
    train_on: str  # gpu, cpu or none
    tiny_model_dir: Path
    user: list[str] = field(default_factory=list)  # key=value after --
    attention_line: str = ""
    attention_refusal: str = ""
    use_sample_data: bool = False
    data_home: Path = Path()
    exports: dict[str, str] = field(default_factory=dict)  # the environment verl gets
    device_overrides: list[str] = field(default_factory=list)
    overrides: list[str] = field(default_factory=list)
    knob_keys: dict[str, str] = field(default_factory=dict)  # verl key -> its knob
    extra: dict[str, str] = field(default_factory=dict)  # what hooks keep for later
    save_every_line: str = ""

    @property
    def trainer(self) -> str:
        return self.recipe.trainer

    @property
    def run_dir(self) -> Path:
        return Path(self.values["RUN_DIR"])

    @property
    def verl_module(self) -> str:
        return VERL_MODULES[self.trainer]

    @property
    def python(self) -> str:
        return self.env.get("PYTHON") or sys.executable

    def on_ray_cluster(self) -> bool:
        return (self.trainer, self.train_on) == ("ppo", "gpu") and bool(self.env.get("RAY_ADDRESS"))

    def all_overrides(self, user: Sequence[str], picked: Sequence[str] = ()) -> list[str]:
        return [*self.device_overrides, *self.overrides, *self.recipe.overrides, *picked, *user]

    def ignored(self) -> list[str]:
        return [k.name for k in KNOBS if k.name in self.from_env and self.trainer not in k.trainers]

    def logs_to_wandb(self) -> bool:
        return "wandb" in self.values["LOGGER"].split(",")

    def problems(self) -> list[str]:
        """The knob checks' lines, and a user's trainer.logger without file."""
        lines = problems(self.values)
        loggers = [item for item in self.user if split_override(item)[0] == "trainer.logger"]
        value = "" if not loggers or loggers[-1].startswith("~") else split_override(loggers[-1])[1]
        names = [name for n in value.split(",") if (name := n.strip(" '\"[]"))]
        if loggers and "file" not in names:
            lines.append(f"{loggers[-1]} after -- leaves out verl's file logger, which writes "
                         f"RUN_DIR/metrics/ (the report, the watchdog and a resume read it): "
                         f"write trainer.logger=[{','.join([*names, 'file'])}]")  # fmt: skip
        return lines


@dataclass
class Values:
    """A knob's value: environment > hooks > recipe > table default."""

    env: Mapping[str, str]
    recipe: Recipe
    hooked: dict[str, str] = field(default_factory=dict)

    def set_default(self, name: str, value: str) -> None:
        self.hooked[name] = value

    def get(self, name: str, fallback: str | None = None) -> str | None:
        if self.env.get(name):
            return self.env[name]
        for source in (self.hooked, self.recipe.settings):
            if name in source:
                return source[name]
        default = BY_NAME[name].default if name in BY_NAME else None
        return fallback if default is None else default


def _absolute(path: str, hub: bool = False) -> str:
    """Ray's workers do not share our working directory; a hub id stays."""
    if os.path.isabs(path) or (hub and not os.path.exists(path)):
        return path
    return os.path.join(os.getcwd(), path)


def recipe_hooks(recipe: Recipe) -> ModuleType | None:
    return importlib.import_module(f"verl_gsm8k.launch.{recipe.hooks}") if recipe.hooks else None


def _resolve(values: Values, train_on: str, tiny: Path, user: Sequence[str]) -> dict[str, str]:
    """Every knob's value for this trainer, each rule applied, paths absolute."""
    env, recipe, ppo = values.env, values.recipe, values.recipe.trainer == "ppo"
    out = {k.name: v for k in KNOBS if recipe.trainer in k.trainers
           and (v := values.get(k.name)) is not None}  # fmt: skip
    if train_on == "cpu" and not env.get("MODEL_PATH") and "MODEL_PATH" not in values.hooked:
        out["MODEL_PATH"] = str(tiny)
    out["MODEL_PATH"] = _absolute(out["MODEL_PATH"], hub=True)
    steps = env.get("TOTAL_TRAINING_STEPS", "")
    if not ppo and not env.get("TOTAL_EPOCHS") and steps.isdigit() and steps[0] != "0":
        out["TOTAL_EPOCHS"] = steps
    prefix = "GSM8K" if ppo else "SFT"
    for name, file in ((f"{prefix}_TRAIN_FILE", "train"), (f"{prefix}_TEST_FILE", "test")):
        out[name] = _absolute(values.get(name) or f"{out['DATA_DIR']}/{file}.parquet")
    if ppo:
        model = values.get("CRITIC_MODEL_PATH") or out["MODEL_PATH"]
        out["CRITIC_MODEL_PATH"] = _absolute(model, hub=True)
        out["REWARD_FILE"] = _absolute(values.get("REWARD_FILE") or str(ROOT / "rewards/gsm8k.py"))
    out["EXPERIMENT_NAME"] = values.get("EXPERIMENT_NAME") or recipe.name
    out["RUNS_ROOT"] = values.get("RUNS_ROOT") or str(ROOT / "runs")
    run_dir = values.get("RUN_DIR") or f"{out['RUNS_ROOT']}/{out['EXPERIMENT_NAME']}"
    out["RUN_DIR"] = _absolute(run_dir)
    length = out.get("MAX_RESPONSE_LENGTH", "")
    for item in user:
        if "=" in item and not item.startswith("~"):
            key, value = split_override(item)
            length = value if key == "data.max_response_length" else length
    if out.get("OVERLONG_BUFFER_LEN") == "auto" and length.isdigit():
        out["OVERLONG_BUFFER_LEN"] = str(max(1, int(length) // 5))
    if out.get("TOOLS"):
        out.setdefault("TOOL_TURNS", str(TURNS))
    if not out.get("LOGGER"):
        out["LOGGER"] = "console,file" + (",wandb" if env.get("WANDB_API_KEY") else "")
    return out


def make_plan(recipe: Recipe, env: Mapping[str, str], gpu: Callable[[], bool] | None = None,
              probe: bool = True, user: Sequence[str] = ()) -> Plan:  # fmt: skip
    values = Values(env, recipe)
    train_on = values.get("DEVICE") or "auto"
    if train_on == "auto" and (gpu or (lambda: has_gpu(env)))():
        train_on = "gpu"
    elif train_on == "auto" and recipe.cpu_by_default:
        train_on = "cpu"
    elif train_on not in ("gpu", "cpu"):
        train_on = "none"
    home = Path(env.get("HOME", "~"))
    cache = values.get("CACHE_DIR") or os.path.join(env.get("XDG_CACHE_HOME") or home / ".cache",
                                                    "verl-gsm8k")  # fmt: skip
    values.set_default("CACHE_DIR", cache)
    extra: dict[str, str] = {}
    hooks = recipe_hooks(recipe)
    if hooks is not None:
        hooks.defaults(values, extra)
    ppo = recipe.trainer == "ppo"
    tools = values.get("TOOLS") if ppo else None
    data_name = f"gsm8k-{tools}" if tools else "gsm8k" if ppo else "gsm8k-sft"
    data_home = home / "data" / data_name
    use_sample = (
        train_on == "cpu" and not values.get("DATA_DIR")
        and not values.get("GSM8K_TRAIN_FILE" if ppo else "SFT_TRAIN_FILE")
        and not (data_home / "train.parquet").exists()
    )  # fmt: skip
    sample = Path(cache) / f"{data_name}-sample"
    values.hooked.setdefault("DATA_DIR", str(sample if use_sample else data_home))
    tiny = Path(cache) / "tiny-qwen2"
    plan = Plan(recipe, env, _resolve(values, train_on, tiny, user),
                {k for k in BY_NAME if env.get(k)}, train_on, tiny, list(user),
                use_sample_data=use_sample, data_home=data_home, extra=extra)  # fmt: skip
    value = plan.values.get("SAVE_EVERY_MIN")
    if value is not None and BY_NAME["SAVE_EVERY_MIN"].check.ok(value):
        minutes, plan.save_every_line = save_every.choose(plan.run_dir, value)
        plan.values["SAVE_EVERY_MIN"] = f"{minutes:g}" if value == "auto" else value
    _device(plan, probe)
    _knob_overrides(plan)
    return plan


def probe_attention(plan: Plan) -> None:
    plan.device_overrides.clear()
    plan.exports.clear()
    _device(plan, True)


def _device(plan: Plan, probe: bool) -> None:
    env, exports, on_cpu = plan.env, plan.exports, plan.train_on == "cpu"
    suffix = "" if plan.trainer == "ppo" else "_sft"
    exports["ATTENTION"] = plan.values.get("ATTENTION", "auto")
    choice, line = "sdpa", "sdpa (not probed)"
    if probe:
        from verl_gsm8k.common.attention import AttentionRefused
        from verl_gsm8k.common.attention import probe as ask

        try:
            asked = ask(exports["ATTENTION"], on_cpu)
            choice, line = asked.name, asked.line()
        except AttentionRefused as refused:
            plan.attention_refusal = f"attention: {refused}"
            line = f"refused ({plan.attention_refusal})"
    plan.attention_line = line
    left_out = {"attention_fallback"} if choice == "fa2" else set()
    if choice != "fa2":
        plan.device_overrides.append(f"+attention={choice}{suffix}")
    if on_cpu:
        plan.device_overrides.append(f"+device=cpu{suffix}")
        exports["OMP_NUM_THREADS"] = env.get("OMP_NUM_THREADS") or "1"  # processes share cores
        exports["VERL_PLATFORM"] = "cpu"
        exports["VERL_ENGINE_DEVICE"] = "cuda"  # verl registers its FSDP engines for cuda/npu only
        if plan.trainer == "ppo":
            exports["VLLM_CPU_KVCACHE_SPACE"] = env.get("VLLM_CPU_KVCACHE_SPACE") or "1"  # GiB
            exports["VLLM_CPU_OMP_THREADS_BIND"] = env.get("VLLM_CPU_OMP_THREADS_BIND") or "nobind"
            # no idle Python worker per logical CPU started in advance
            for name in ("RAY_enable_worker_prestart", "RAY_prestart_worker_first_driver"):
                exports[name] = env.get(name) or "0"
    else:
        left_out.add("cpu_platform")
    if plan.trainer != "ppo":
        left_out |= {"register_trainer", "stop_on_sigterm"}
    modules = [m for m in VERL_PLUGINS if m.rsplit(".", 1)[1] not in left_out]
    exports["VERL_USE_EXTERNAL_MODULES"] = ",".join(
        [*modules, env.get("VERL_USE_EXTERNAL_MODULES", "")]).strip(",")  # fmt: skip
    if plan.logs_to_wandb():
        exports["WANDB_DIR"] = env.get("WANDB_DIR") or str(plan.run_dir)
    if env.get("RAY_ADDRESS") and plan.trainer == "ppo":
        plan.device_overrides.append("+ray=attach")
        shared = {name: exports.get(name) or env.get(name) or "" for name in RAY_ENV_VARS}
        plan.device_overrides += ray_env_overrides(shared)


def ray_env_overrides(variables: Mapping[str, str]) -> list[str]:
    key = "+ray_kwargs.ray_init.runtime_env.env_vars"
    return [f"{key}.{name}={hydra_quote(value)}" for name, value in variables.items() if value]


def _knob_overrides(plan: Plan) -> None:
    for knob in KNOBS:
        value = plan.values.get(knob.name)
        for key in knob.keys(plan.trainer) if value is not None else ():
            plan.overrides.append(key.override(value))
            plan.knob_keys[key.path] = knob.name
    if plan.trainer == "ppo":
        plan.overrides.append("trainer.v1.trainer_mode=gsm8k")
    if plan.values.get("RESUME") == "disable":
        plan.overrides.append("trainer.resume_mode=disable")
        plan.knob_keys["trainer.resume_mode"] = "RESUME"


def recipe_plan(recipe_file: Path, env: Mapping[str, str], gpu: bool = False,
                user: Sequence[str] = ()) -> Plan:  # fmt: skip
    """A recipe file's plan, attention not probed (tests)."""
    recipe, _ = parse_recipe(recipe_arguments(recipe_file))
    return make_plan(recipe, env, gpu=lambda: gpu, probe=False, user=user)


def bare_overrides(config_name: str, env: Mapping[str, str], trainer: str = "ppo",
                   cwd: Path | None = None) -> list[str]:  # fmt: skip
    """A bare recipe's overrides over ``config_name`` (the preflight's tests)."""
    with contextlib.chdir(cwd or os.getcwd()):
        return make_plan(Recipe("preflight", config_name, trainer), env).all_overrides([])
