"""A model resolved, a server probed, and ``vllm serve`` in its own process group, the whole
group always stopped."""

import contextlib
import http.client
import json
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from verl_gsm8k.common import procs
from verl_gsm8k.common.children import dies_with_this_process
from verl_gsm8k.evaluate.settings import PROG, EvalError, ModelSpec, Settings
from verl_gsm8k.evaluate.tool_mode import MODE, VLLM_TOOL_ARGS

PROBE_TIMEOUT = 5.0
STOP_GRACE_S = 30.0


def resolve_model_path(source: str) -> str:
    path = Path(source).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise EvalError(f"{path} has no config.json (not a Hugging Face model directory)")
        return str(path.resolve())
    if path.exists() or source.startswith((".", "/", "~")) or source.count("/") != 1:
        raise EvalError(f"model not found: {source} (neither a directory nor a hub id)")
    try:
        from huggingface_hub import snapshot_download

        patterns = ["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja"]
        return snapshot_download(source, allow_patterns=patterns)
    except Exception as err:  # offline, unknown repo, no access
        first = str(err).splitlines()[0] if str(err) else ""
        raise EvalError(f"cannot get {source} from the Hugging Face hub or its cache "
                        f"({type(err).__name__}: {first}); download it once with network, or "
                        "pass a local directory") from None  # fmt: skip


def vllm_serve_command(vllm_bin: str, model: str, port: int, served_name: str,
                       extra: list[str]) -> list[str]:  # fmt: skip
    return [vllm_bin, "serve", model, "--host", "127.0.0.1", "--port", str(port),
            "--served-model-name", served_name, *extra]  # fmt: skip


def probe_openai(base_url: str, served_name: str, api_key: str = "EMPTY") -> str | None:
    """``GET <base_url>/models``: None when it lists ``served_name``, else what is wrong."""
    parts = urllib.parse.urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "not an http(s) URL (expected e.g. http://127.0.0.1:8000/v1)"
    url = f"{base_url.rstrip('/')}/models"
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {api_key}"})
    try:
        with urllib.request.urlopen(request, timeout=PROBE_TIMEOUT) as response:
            body = response.read(1 << 20)
    except urllib.error.HTTPError as err:
        return f"GET {url} answered HTTP {err.code} {err.reason}"
    except (OSError, ValueError, http.client.HTTPException) as err:
        reason = err.reason if isinstance(err, urllib.error.URLError) else err
        if isinstance(reason, ConnectionRefusedError):
            return f"connection refused (nothing listens on {parts.netloc})"
        return f"GET {url} failed: {type(reason).__name__}: {reason}"  # timeout, unknown host
    try:
        models = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return f"GET {url} did not answer JSON (starts with {body[:40]!r})"
    models = models.get("data") if isinstance(models, dict) else None
    if not isinstance(models, list) or not all(isinstance(m, dict) for m in models):
        return f"GET {url} answered JSON that is not an OpenAI model list (no 'data' list)"
    served = [str(m.get("id")) for m in models]
    if served_name not in served:
        listed = ", ".join(served[:5]) + (", ..." if len(served) > 5 else "")
        return f"the server does not serve {served_name!r} (it lists: {listed or 'no model'})"
    return None


@contextlib.contextmanager
def served(spec: ModelSpec, settings: Settings) -> Iterator[str]:
    """``vllm serve`` of ``spec``: its base URL once it answers."""
    with socket.socket() as sock:  # a free port
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    tools = VLLM_TOOL_ARGS if MODE in settings.modes else []
    cmd = vllm_serve_command(settings.vllm_bin, str(spec.path), port, spec.label,
                             [*tools, *settings.vllm_args])  # fmt: skip
    base, log = f"http://127.0.0.1:{port}/v1", settings.out / "logs" / f"vllm-{spec.label}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    print(f"{PROG}: starting server: {' '.join(cmd)}  (log: {log})", flush=True)
    try:
        with log.open("wb") as out:
            # SIGTERM on our death: vllm serve stops its engines (a SIGKILL would orphan them)
            proc = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, preexec_fn=dies_with_this_process(signal.SIGTERM),
            )  # fmt: skip
    except OSError as err:
        raise EvalError(f"cannot start the server {cmd[0]}: {err}") from None
    try:
        deadline = time.monotonic() + settings.server_timeout
        while (problem := probe_openai(base, spec.label, settings.api_key)) is not None:
            code = proc.poll()
            if code is not None or time.monotonic() > deadline:
                url, wait = f"{base}/models", f"{settings.server_timeout:.0f} s"
                why = f"did not answer {url} within {wait} (last probe: {problem})"
                why = f"exited with code {code} before answering {url}" if code is not None else why
                tail = log.read_text(errors="replace").rstrip().splitlines()[-40:]
                raise EvalError(f"the server {why}; last lines of {log}:\n" + "\n".join(tail))
            time.sleep(1.0)
        print(f"{PROG}: server ready at {base}", flush=True)
        yield base
    finally:  # the whole group
        procs.stop(lambda: [p.pid for p in procs.ours() if procs.group_of(p.pid) == proc.pid],
                   STOP_GRACE_S)  # fmt: skip
        proc.wait()
        print(f"{PROG}: server stopped (pid {proc.pid})", flush=True)
