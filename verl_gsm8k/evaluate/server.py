"""Models and servers: GPU detection, model resolution (directory or hub cache), and the
``vllm serve`` process lifecycle (start in its own process group, probe ``/v1/models`` until
ready, always stop the whole group; stopped with the evaluation even where that is SIGKILLed)."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from verl_gsm8k.common import gpus
from verl_gsm8k.common.children import dies_with_this_process
from verl_gsm8k.evaluate.settings import LOG_TAIL_LINES, PROG, EvalError

PROBE_TIMEOUT = 5.0  # seconds for one GET /v1/models


def has_gpu() -> bool:
    """Whether nvidia-smi lists a GPU here (common/gpus.py)."""
    return bool(gpus.listed())


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


def vllm_serve_command(
    vllm_bin: str, model: str, port: int, served_name: str, extra: list[str]
) -> list[str]:
    """The `vllm serve` command eval.sh runs for a local model (tests/test_gpu_stack.py checks
    these flags against the GPU stack's own vLLM argument parser)."""
    return [vllm_bin, "serve", model, "--host", "127.0.0.1", "--port", str(port),
            "--served-model-name", served_name, *extra]  # fmt: skip


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now. Not reserved: another process
    can take it before the caller binds it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.rstrip().splitlines()[-lines:]) or "(empty log)"


def probe_openai(
    base_url: str, served_name: str, api_key: str = "EMPTY", timeout: float = PROBE_TIMEOUT
) -> str | None:
    """Ask an OpenAI-compatible server for ``GET <base_url>/models`` once: None when it answers
    with an OpenAI model list that holds ``served_name``, else what was wrong, in a few words."""
    parts = urllib.parse.urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "not an http(s) URL (expected e.g. http://127.0.0.1:8000/v1)"
    url = f"{base_url.rstrip('/')}/models"
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {api_key}"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            body = response.read(1 << 20)
    except urllib.error.HTTPError as err:
        return f"GET {url} answered HTTP {err.code} {err.reason}"
    except urllib.error.URLError as err:
        reason = err.reason
        if isinstance(reason, ConnectionRefusedError):
            return f"connection refused (nothing listens on {parts.netloc})"
        if isinstance(reason, socket.gaierror):
            return f"unknown host {parts.hostname!r}"
        if isinstance(reason, TimeoutError):
            return f"no answer from GET {url} within {timeout:.0f} s"
        return f"cannot reach {url}: {reason}"
    except TimeoutError:
        return f"no answer from GET {url} within {timeout:.0f} s"
    except (OSError, ValueError, http.client.HTTPException) as err:
        return f"GET {url} failed: {type(err).__name__}: {err}"
    try:
        listing = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return f"GET {url} did not answer JSON (starts with {body[:40]!r})"
    models = listing.get("data") if isinstance(listing, dict) else None
    if not isinstance(models, list) or not all(isinstance(m, dict) for m in models):
        return f"GET {url} answered JSON that is not an OpenAI model list (no 'data' list)"
    served = [str(m.get("id")) for m in models]
    if served_name not in served:
        listed = ", ".join(served[:5]) + (", ..." if len(served) > 5 else "")
        return f"the server does not serve {served_name!r} (it lists: {listed or 'no model'})"
    return None


class ServerProcess:
    """``vllm serve`` (or anything with its command line) in its own process group."""

    def __init__(
        self,
        cmd: list[str],
        base_url: str,
        served_name: str,
        log_path: Path,
        timeout: float,
        api_key: str = "EMPTY",
    ):
        self.cmd, self.base_url, self.served_name = cmd, base_url, served_name
        self.log_path, self.timeout, self.api_key = log_path, timeout, api_key
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
                    # SIGTERM: vllm serve then stops its engine processes (SIGKILL would
                    # orphan them, with the GPU memory they hold)
                    preexec_fn=dies_with_this_process(signal.SIGTERM),  # noqa: PLW1509
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
        problem = "no answer yet"
        while time.monotonic() < deadline:
            code = self.proc.poll()
            if code is not None:
                raise EvalError(
                    f"the server exited with code {code} before answering {url}; last lines of "
                    f"{self.log_path}:\n{log_tail(self.log_path)}"
                )
            problem = probe_openai(self.base_url, self.served_name, self.api_key)
            if problem is None:
                print(f"{PROG}: server ready at {self.base_url}", flush=True)
                return
            time.sleep(1.0)
        raise EvalError(
            f"the server did not answer {url} within {self.timeout:.0f} s (last probe: "
            f"{problem}); last lines of {self.log_path}:\n{log_tail(self.log_path)}"
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
