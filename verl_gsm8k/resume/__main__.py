"""python -m verl_gsm8k.resume: the checkpoint a launch resumes verified (verify.py), compared with
the launch that wrote it (same_config.py), resharded when only the GPU count changed; then the
launch record written. Exit 0, or 2 with one line and nothing written. The launcher runs
record_launch in its own process right before verl starts."""

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from verl_gsm8k.common.launch_record import RecordError, build_record, write_record
from verl_gsm8k.common.run_dir import ROLES, STAMP, saved_steps, step_dir
from verl_gsm8k.reshard.shards import ReshardError, reshard_step
from verl_gsm8k.resume.same_config import MODES, latest_checkpoint, refusal, set_aside
from verl_gsm8k.resume.verify import NoWholeCheckpoint, resume_point, track

ROOT = Path(__file__).resolve().parents[2]


def composed(config_dir: Path, config_name: str, overrides: list[str]) -> dict[str, Any]:
    """The resolved config verl will run (Hydra over the installed verl configs)."""
    from omegaconf import OmegaConf

    from verl_gsm8k.preflight.compose import compose

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        cfg = compose(config_dir, config_name, overrides)
    except Exception as err:  # Hydra raises several types; the message is what matters
        raise RecordError(f"the config does not compose: {str(err).splitlines()[0]}") from None
    try:
        return OmegaConf.to_container(cfg, resolve=True)
    except Exception:  # an interpolation only verl's runtime resolves: kept as written
        return OmegaConf.to_container(cfg, resolve=False)


def _roles_and_loads(run_dir: Path, config: dict[str, Any]) -> tuple[tuple[str, ...], dict]:
    """The roles a PPO checkpoint holds (the critic when verl runs one) and each role's
    ``checkpoint.load_contents``, what verl's resume reads."""
    from omegaconf import OmegaConf
    from verl.trainer.ppo.utils import need_critic

    loads = {}
    for role, node in (("actor", config.get("actor_rollout_ref", {}).get("actor", {})),
                       ("critic", config.get("critic", {}))):  # fmt: skip
        contents = (node.get("checkpoint") or {}).get("load_contents")
        if isinstance(contents, list):
            loads[role] = [str(item) for item in contents]
    if not saved_steps(run_dir):  # need_critic imports verl's trainer: ~6 s on 2 cores
        return (), loads
    return (ROLES if need_critic(OmegaConf.create(config)) else ROLES[:1]), loads


def record_launch(
    run_dir: Path, stamp: str, recipe: str, trainer: str, config_name: str,
    overrides: list[str], *, resume: str = "auto", knobs: dict[str, str] | None = None,
    knob_keys: dict[str, str] | None = None, user: Sequence[str] = (),
    verl_command: str | None = None, config_dir: Path = ROOT / "configs",
) -> int:  # fmt: skip
    """The step verl resumes verified and compared, then the record: 0, or 2 with one line on
    stderr and nothing written."""
    from verl_gsm8k.preflight.device import visible_gpus

    try:
        if not STAMP.match(stamp):
            raise RecordError(f"--stamp {stamp!r}: not YYYYMMDDTHHMMSSZ")
        config = composed(config_dir.resolve(), config_name, list(overrides))
        record = build_record(stamp=stamp, recipe=recipe, trainer=trainer,
                              config_name=config_name, knobs=dict(knobs or {}),
                              knob_keys=dict(knob_keys or {}), user_overrides=list(user),
                              config=config, root=ROOT, gpus=visible_gpus(),
                              verl_command=verl_command)  # fmt: skip
        # the tracker points at the step verl resumes only once the launch may go on
        step, said = None, []
        if resume != "disable" and trainer == "ppo":
            roles, loads = _roles_and_loads(run_dir, config)
            step, said = resume_point(run_dir, roles, write=False, loads=loads)
        elif resume != "disable":
            step = latest_checkpoint(run_dir)
        stop = refusal(run_dir, step, record, resume)
        if stop:
            print(stop, file=sys.stderr)
            return 2
        if trainer == "ppo" and step is not None:  # only the world size changed: resharded
            trainer_cfg = config.get("trainer", {})
            world = int(trainer_cfg.get("nnodes", 1)) * int(trainer_cfg.get("n_gpus_per_node", 1))
            said += reshard_step(step_dir(run_dir, step), world)
            track(run_dir, step)
        if resume == "disable":
            said += set_aside(run_dir, stamp)
        print("\n".join(said), end="\n" if said else "")
        path = write_record(run_dir, record)
    except (RecordError, NoWholeCheckpoint, ReshardError) as err:
        print(f"launch: {err}", file=sys.stderr)
        return 2
    print(f"launch: recorded -> {path}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m verl_gsm8k.resume", description=__doc__)
    parser.add_argument("--run-dir", type=Path, required=True, help="the run directory")
    parser.add_argument("--stamp", required=True, help="the launch's UTC stamp")
    parser.add_argument("--recipe", required=True, help="the recipe's name")
    parser.add_argument("--trainer", choices=("ppo", "sft"), default="ppo", help="verl trainer")
    parser.add_argument("--config-name", required=True, help="the config of configs/")
    parser.add_argument("--resume", choices=MODES, default="auto", help="RESUME (docs/knobs.md)")
    parser.add_argument("--knob", action="append", default=[], metavar="NAME=VALUE",
                        help="a knob the launch set")  # fmt: skip
    parser.add_argument("overrides", nargs="*", help="the launch's override list (after --)")
    args = parser.parse_args(argv)
    knobs = dict(item.partition("=")[::2] for item in args.knob)
    return record_launch(args.run_dir, args.stamp, args.recipe, args.trainer, args.config_name,
                         args.overrides, resume=args.resume, knobs=knobs)  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
