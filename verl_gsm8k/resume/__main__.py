"""python -m verl_gsm8k.resume: what this launch resumes (verified, same config), then its record.

    python -m verl_gsm8k.resume --run-dir DIR --stamp UTC --recipe NAME --trainer ppo \\
        --config-name gsm8k_ppo [--resume auto] [--knob NAME=VALUE ...] [--knob-key KEY=NAME ...] \\
        [--user KEY=VALUE ...] -- OVERRIDE ...

Run by the launcher right before verl starts. The checkpoint verl would resume is verified
first (verify.py: an earlier whole one when it is damaged), then compared with the launch that
wrote it (same_config.py: every key of the resolved config but the few that may change on a resume).
Exit 0: the record is written (DIR/launches/launch-UTC.yaml) and the tracker names the step verl
resumes; 2: one line on stderr (a resume of another experiment refused, no whole checkpoint, a
config that does not compose, a record that exists), and nothing written.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from verl_gsm8k.common.launch_record import RecordError, build_record, write_record
from verl_gsm8k.common.run_dir import ROLES, STAMP, saved_steps, step_dir
from verl_gsm8k.reshard.shards import ReshardError, reshard_step
from verl_gsm8k.resume.same_config import MODES, latest_checkpoint, refusal, set_aside
from verl_gsm8k.resume.verify import NoWholeCheckpoint, resume_point, track

PROG = "verl_gsm8k.resume"
ROOT = Path(__file__).resolve().parents[2]


def _pairs(items: Sequence[str], flag: str) -> dict[str, str]:
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise RecordError(f"{flag} {item!r}: not NAME=VALUE")
        out[name] = value
    return out


def composed(config_dir: Path, config_name: str, overrides: list[str]) -> dict:
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
    except Exception:  # an interpolation only verl's runtime can resolve: keep it as written
        return OmegaConf.to_container(cfg, resolve=False)


def uses_critic(config: dict) -> bool:
    from omegaconf import OmegaConf
    from verl.trainer.ppo.utils import need_critic

    return bool(need_critic(OmegaConf.create(config)))


def loads(config: dict) -> dict[str, list[str]]:
    """Each role's ``checkpoint.load_contents`` as verl resolves it (what its resume reads)."""
    keys = {"actor": ("actor_rollout_ref", "actor"), "critic": ("critic",)}
    found = {}
    for role, path in keys.items():
        node: object = config
        for part in (*path, "checkpoint", "load_contents"):
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, list):
            found[role] = [str(item) for item in node]
    return found


def world_size(config: dict) -> int:
    """The ranks verl's FSDP runs on: trainer.nnodes x trainer.n_gpus_per_node."""
    trainer = config.get("trainer", {})
    return int(trainer.get("nnodes", 1)) * int(trainer.get("n_gpus_per_node", 1))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"python -m {PROG}", description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-dir", type=Path, required=True, help="the run directory (RUN_DIR)")
    parser.add_argument(
        "--stamp", required=True, help="the launch's UTC stamp, YYYYMMDDTHHMMSSZ (as its metrics)"
    )
    parser.add_argument("--recipe", required=True, help="the recipe's name (recipes/NAME.sh)")
    parser.add_argument("--trainer", choices=("ppo", "sft"), default="ppo", help="verl trainer")
    parser.add_argument(
        "--config-name", required=True, help="the config of configs/ the launch composes"
    )
    parser.add_argument(
        "--config-dir", type=Path, default=ROOT / "configs", help="default: the repo's configs/"
    )
    parser.add_argument(
        "--resume",
        choices=MODES,
        default="auto",
        help="auto: resume a checkpoint only when the launch that wrote it had the same config, "
        "every key compared but the few that may change on a resume (total steps, save and test "
        "frequency, loggers, speed and memory settings: same_config.py ALLOWED); else stop with "
        "one line naming each key that differs; force: resume whatever differs; disable: the "
        "launch starts over (verl's trainer.resume_mode=disable)",
    )
    parser.add_argument(
        "--knob", action="append", default=[], metavar="NAME=VALUE", help="a knob the launch set"
    )
    parser.add_argument(
        "--knob-key",
        action="append",
        default=[],
        metavar="KEY=NAME",
        help="verl key KEY was set by knob NAME",
    )
    parser.add_argument(
        "--user",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an override the user gave on the command line (also in the list after --)",
    )
    parser.add_argument(
        "--verl-command",
        default=None,
        help="the exact command the launch gives verl, one shell line "
        "(common/command_line.py): kept in the record",
    )
    parser.add_argument("overrides", nargs="*", help="the launch's full override list (after --)")
    return parser


def record_launch(
    run_dir: Path, stamp: str, recipe: str, trainer: str, config_name: str,
    overrides: list[str], *, resume: str = "auto", knobs: dict[str, str] | None = None,
    knob_keys: dict[str, str] | None = None, user: Sequence[str] = (),
    verl_command: str | None = None, config_dir: Path = ROOT / "configs",
) -> int:  # fmt: skip
    """The launcher's call: the step verl resumes verified and compared, then the record; 0, or
    2 with one line on stderr and nothing written (the module docstring)."""
    try:
        if not STAMP.match(stamp):
            raise RecordError(f"--stamp {stamp!r}: not YYYYMMDDTHHMMSSZ")
        config = composed(config_dir.resolve(), config_name, list(overrides))
        from verl_gsm8k.preflight.device import visible_gpus

        record = build_record(
            stamp=stamp,
            recipe=recipe,
            trainer=trainer,
            config_name=config_name,
            knobs=dict(knobs or {}),
            knob_keys=dict(knob_keys or {}),
            user_overrides=list(user),
            config=config,
            root=ROOT,
            gpus=visible_gpus(),
            verl_command=verl_command,
        )
        # The step verl will resume, verified first (it may be an earlier whole one than the
        # tracker names), then the same-config check on that step; the tracker is pointed at it
        # only once the launch may go on: a refused launch changes nothing.
        step, said = None, []
        if resume != "disable":
            if trainer == "ppo":
                # verl's need_critic imports its trainer (~6 s of a launch on 2 cores): asked only
                # where there are checkpoints to verify
                roles: tuple[str, ...] = ()
                if saved_steps(run_dir):
                    roles = ROLES if uses_critic(config) else ROLES[:1]
                step, said = resume_point(run_dir, roles, write=False, loads=loads(config))
            else:
                step = latest_checkpoint(run_dir)
        stop = refusal(run_dir, step, record, resume)
        if stop:
            print(stop, file=sys.stderr)
            return 2
        if trainer == "ppo" and step is not None:
            # only the world size changed: the checkpoint's shards rewritten for the new one
            said += reshard_step(step_dir(run_dir, step), world_size(config))
            track(run_dir, step)
        if resume == "disable":
            said += set_aside(run_dir, stamp)
        for line in said:
            print(line)
        path = write_record(run_dir, record)
    except (RecordError, NoWholeCheckpoint, ReshardError) as err:
        print(f"launch: {err}", file=sys.stderr)
        return 2
    print(f"launch: recorded -> {path}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        knobs, knob_keys = _pairs(args.knob, "--knob"), _pairs(args.knob_key, "--knob-key")
    except RecordError as err:
        print(f"launch: {err}", file=sys.stderr)
        return 2
    return record_launch(
        args.run_dir, args.stamp, args.recipe, args.trainer, args.config_name,
        list(args.overrides), resume=args.resume, knobs=knobs, knob_keys=knob_keys,
        user=args.user, verl_command=args.verl_command, config_dir=args.config_dir,
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
