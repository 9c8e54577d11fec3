"""Models and servers: GPU detection, model resolution (directory or hub cache), and the
``vllm serve`` process lifecycle (start in its own process group, probe ``/v1/models`` until
ready, always stop the whole group)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from eval_common import LOG_TAIL_LINES, PROG, EvalError


def has_gpu() -> bool:
    if shutil.which("nvidia-smi") is None:
        return False
    try:
        out = subprocess.run(
            ["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return any(line.startswith("GPU") for line in out.splitlines())


def resolve_model_path(source: str) -> str:
    """A local directory for a model: the directory itself, or the hub snapshot (cached)."""
    path = Path(source).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise EvalError(f"{path} has no config.json (not a Hugging Face model directory)")
        return str(path.resolve())
    if path.exists() or source.startswith((".", "/", "~")) or source.count("/") != 1:
        raise EvalError(f"model not found: {source} (neither a directory nor a hub id)")
    try:
        from huggingface_hub import snapshot_download

        return snapshot_download(
            source, allow_patterns=["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja"]
        )
    except Exception as err:  # offline, unknown repo, no access: all mean "not here"
        raise EvalError(
            f"cannot get {source} from the Hugging Face hub or its cache "
            f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}); "
            "download it once with network, or pass a local directory"
        ) from None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.rstrip().splitlines()[-lines:]) or "(empty log)"


class ServerProcess:
    """``vllm serve`` (or anything with its command line) in its own process group."""

    def __init__(
        self, cmd: list[str], base_url: str, served_name: str, log_path: Path, timeout: float
    ):
        self.cmd, self.base_url, self.served_name = cmd, base_url, served_name
        self.log_path, self.timeout = log_path, timeout
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> ServerProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        print(f"{PROG}: starting server: {' '.join(self.cmd)}  (log: {self.log_path})", flush=True)
        with self.log_path.open("wb") as log:
            try:
                self.proc = subprocess.Popen(
                    self.cmd,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
            except OSError as err:
                raise EvalError(f"cannot start the server {self.cmd[0]}: {err}") from None
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def wait_ready(self) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + self.timeout
        url = f"{self.base_url}/models"
        while time.monotonic() < deadline:
            code = self.proc.poll()
            if code is not None:
                raise EvalError(
                    f"the server exited with code {code} before answering {url}; last lines of "
                    f"{self.log_path}:\n{log_tail(self.log_path)}"
                )
            try:
                with urllib.request.urlopen(url, timeout=5) as response:
                    models = json.loads(response.read().decode("utf-8")).get("data") or []
                if any(m.get("id") == self.served_name for m in models):
                    print(f"{PROG}: server ready at {self.base_url}", flush=True)
                    return
            except (urllib.error.URLError, OSError, ValueError):
                pass
            time.sleep(1.0)
        raise EvalError(
            f"the server did not answer {url} within {self.timeout:.0f} s; last lines of "
            f"{self.log_path}:\n{log_tail(self.log_path)}"
        )

    def stop(self) -> None:
        """Stop the whole process group: SIGTERM, then SIGKILL after 30 s."""
        proc = self.proc
        if proc is None:
            return
        for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
            try:
                os.killpg(proc.pid, sig)
            except (ProcessLookupError, PermissionError):
                break
            try:
                proc.wait(timeout=wait)
                # the leader is gone; make sure no child of the group survives it
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
                break
            except subprocess.TimeoutExpired:
                continue
        if proc.poll() is None:
            proc.wait(timeout=10)
        print(f"{PROG}: server stopped (pid {proc.pid})", flush=True)
        self.proc = None
