"""A checkpoint saved by verl at world size W, resharded, resumes at W' bit for bit.
The ranks' helper: python tests/test_reshard.py save|check MODEL_DIR RUN_DIR W [OUT.json]"""

import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ROLES = ("actor", "critic")
STEP = 1
BATCH, SEQ = 12, 16  # 12 rows split evenly over 1, 2, 3 or 4 ranks

# the next losses at W' vs W: <= 1.2e-7 apart; swapped shards or lost moments moved them >= 8e-5
LOSS_RTOL = 1e-5


def _batch(step: int, rank: int, world: int, vocab: int):
    import torch

    ids = torch.randint(3, vocab, (BATCH, SEQ), generator=torch.Generator().manual_seed(step))
    return ids.chunk(world)[rank]


def _loss(role: str, model, ids):
    if role == "actor":
        return model(input_ids=ids, labels=ids).loss
    target = (ids.float() / model.config.vocab_size).unsqueeze(-1)  # any fixed value target
    return (model(input_ids=ids).logits.float() - target).pow(2).mean()


def _train_step(role: str, model, optimizer, scheduler, step: int, rank: int, world: int) -> float:
    import torch
    import torch.distributed as dist

    loss = _loss(role, model, _batch(step, rank, world, model.config.vocab_size))
    loss.backward()
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    total = loss.detach().clone()
    dist.all_reduce(total)
    return float(total / world) if torch.isfinite(total) else float("nan")


def _full(model, optimizer) -> dict:
    from torch.distributed.tensor import DTensor

    def whole(t):
        return (t.full_tensor() if isinstance(t, DTensor) else t).detach().clone()

    names = [name for name, _ in model.named_parameters()]
    state = optimizer.state_dict()["state"]
    full = {f"param:{n}": whole(p) for n, p in model.named_parameters()}
    for index, moments in state.items():
        for key in ("exp_avg", "exp_avg_sq"):
            full[f"{key}:{names[index]}"] = whole(moments[key])
    return full


def _rank(rank: int, world: int, rendezvous: str, mode: str, model_dir: str, run: str, out: str):
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world))
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoConfig, AutoTokenizer
    from transformers import AutoModelForCausalLM as CausalLM
    from transformers import AutoModelForTokenClassification as TokenClassification
    from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager
    from verl.utils.torch_functional import get_cosine_schedule_with_warmup

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank,
                            world_size=world)  # fmt: skip
    try:
        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("fsdp",))
        results: dict = {}
        for role in ROLES:
            torch.manual_seed(1234 if mode == "save" else 99)  # a load must overwrite all of it
            config = AutoConfig.from_pretrained(model_dir)
            if role == "critic":  # as verl's FSDP engine builds its value model
                config.num_labels, config.classifier_dropout = 1, 0.0
            auto = TokenClassification if role == "critic" else CausalLM
            model = auto.from_pretrained(model_dir, config=config, dtype=torch.float32)
            for layer in model.model.layers:
                fully_shard(layer, mesh=mesh)
            fully_shard(model, mesh=mesh)
            lr = 1e-3 if mode == "save" else 5e-2  # param_groups come from the file on a load
            optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
            scheduler = get_cosine_schedule_with_warmup(optimizer, 2, 10)
            manager = FSDPCheckpointManager(
                model, optimizer, lr_scheduler=scheduler,
                processing_class=AutoTokenizer.from_pretrained(model_dir),
                checkpoint_config={"save_contents": ["model", "optimizer", "extra"]},
            )  # fmt: skip
            folder = str(Path(run) / f"global_step_{STEP}" / role)
            if mode == "save":
                _train_step(role, model, optimizer, scheduler, STEP, rank, world)
                torch.manual_seed(1000 + rank)  # each rank's RNG its own, as in a real run
                manager.save_checkpoint(folder, global_step=STEP)
            else:
                manager.load_checkpoint(folder)
            rng = torch.rand(1).item()  # what this rank's RNG gives right after the save/load
            full = _full(model, optimizer)
            lrs = scheduler.get_last_lr()
            losses = [_train_step(role, model, optimizer, scheduler, s, rank, world)
                      for s in (STEP + 1, STEP + 2)]  # fmt: skip
            rngs = [None] * world
            dist.all_gather_object(rngs, rng)
            if rank == 0:
                torch.save(full, Path(out).with_suffix(f".{role}.pt"))
                results[role] = {"lr": lrs, "losses": losses, "rng": rngs}
        if rank == 0:
            Path(out).write_text(json.dumps(results))
            if mode == "save":
                (Path(run) / "latest_checkpointed_iteration.txt").write_text(str(STEP))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _helper(argv: list[str]) -> int:
    import multiprocessing as mp

    import transformers  # noqa: F401  (imported once; every rank is forked from here)
    import verl.utils.checkpoint.fsdp_checkpoint_manager  # noqa: F401

    mode, model_dir, run, world = argv[0], argv[1], argv[2], int(argv[3])
    out = argv[4] if len(argv) > 4 else str(Path(run) / "saved.json")
    Path(run).mkdir(parents=True, exist_ok=True)
    rendezvous = str(Path(out).with_suffix(".rendezvous"))
    ctx = mp.get_context("fork")  # one process per rank: torch keeps meshes per process
    ranks = [ctx.Process(target=_rank, args=(r, world, rendezvous, mode, model_dir, run, out))
             for r in range(world)]  # fmt: skip
    for proc in ranks:
        proc.start()
    for proc in ranks:
        proc.join(timeout=240)
        proc.kill()  # one still running past its time
    codes = [proc.exitcode for proc in ranks]
    Path(rendezvous).unlink(missing_ok=True)
    if codes != [0] * world:
        print(f"{mode} at world size {world}: rank exit codes {codes}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(_helper(sys.argv[1:]))


import pytest  # noqa: E402
from helpers import assert_loads_as_torch, capture  # noqa: E402

pytestmark = pytest.mark.timeout(600)


def ranks(*args: object, python: str | Path = sys.executable):
    capture([python, __file__, *args], 0, 500)


@pytest.fixture(scope="module")
def saved(real_checkpoints: Path) -> dict[int, Path]:
    return {world: real_checkpoints / f"ws{world}" for world in (1, 2)}


def digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.glob("*.pt"))}


def resharded_and_resumed(saved: Path, old: int, new: int, model: Path, work: Path,
                          python: str | Path = sys.executable) -> None:  # fmt: skip
    import torch

    run = work / "run"
    shutil.copytree(saved, run)
    before = {role: digests(run / f"global_step_{STEP}" / role) for role in ROLES}
    done = capture([python, "-m", "verl_gsm8k.reshard", run, "--world-size", new], 0, cwd=ROOT)
    for role in ROLES:
        said = (f"reshard: global_step_{STEP}/{role} was saved at world size {old}: rewritten "
                f"for {new}")  # fmt: skip
        assert said in done.stdout, done.stdout
        folder = run / f"global_step_{STEP}" / role
        assert json.loads((folder / "fsdp_config.json").read_text())["world_size"] == new
        now = digests(folder)
        assert {k: now[k] for k in before[role]} == before[role]  # the originals, untouched
        assert sum(f"_world_size_{new}_" in name for name in now) == 3 * new
    if str(python) == sys.executable:  # the checked load of this torch, bit for bit
        assert_loads_as_torch(run)
    ranks("check", model, run, new, work / "loaded.json", python=python)
    reference = json.loads((saved / "saved.json").read_text())
    loaded = json.loads((work / "loaded.json").read_text())
    for role in ROLES:
        want = torch.load(saved / f"saved.{role}.pt", weights_only=True)
        got = torch.load(work / f"loaded.{role}.pt", weights_only=True)
        assert want.keys() == got.keys()
        unequal = [name for name in want if not torch.equal(want[name], got[name])]
        assert not unequal, f"{role}: not bit-exact after the reshard: {unequal[:5]}"
        assert loaded[role]["lr"] == reference[role]["lr"]  # the scheduler's place
        # new rank r draws what old rank r % W would have drawn
        assert loaded[role]["rng"] == [reference[role]["rng"][r % old] for r in range(new)]
        for ours, theirs in zip(loaded[role]["losses"], reference[role]["losses"], strict=True):
            assert ours == pytest.approx(theirs, rel=LOSS_RTOL), (role, loaded, reference)


@pytest.mark.parametrize(("old", "new"), [(2, 1), (1, 2)])
def test_a_checkpoint_resharded_resumes_as_if_its_world_size_never_changed(
    saved: dict[int, Path], tiny_model_dir: Path, tmp_path, old: int, new: int
):
    resharded_and_resumed(saved[old], old, new, tiny_model_dir, tmp_path)


def test_a_damaged_shard_stops_the_reshard_in_one_line_and_the_checkpoint_stays(
    saved: dict[int, Path], tmp_path, capsys
):
    from verl_gsm8k.reshard.cli import main  # in this process: torch imported once

    run = tmp_path / "run"
    shutil.copytree(saved[2], run)
    critic = run / f"global_step_{STEP}" / "critic"
    shard = critic / "optim_world_size_2_rank_1.pt"
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])  # a save cut short
    before = digests(critic)
    assert main([str(run), "--world-size", "1"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "optim_world_size_2_rank_1.pt is truncated" in line, line
    assert "the checkpoint as saved is unchanged" in line
    assert json.loads((critic / "fsdp_config.json").read_text())["world_size"] == 2
    assert {k: v for k, v in digests(critic).items() if "_world_size_2_" in k} == before
    assert not [p for p in critic.iterdir() if ".reshard-" in p.name]  # no partial file left
