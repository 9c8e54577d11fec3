"""A minimal OpenAI-compatible chat server (standard library only) for evaluation tests.

It answers ``GET /v1/models`` and ``POST /v1/chat/completions`` (non-streaming). Each chat
request is answered from a table ``{question: response}``: the response of the longest known
question that occurs in the last user message (so it works with zero-shot and few-shot prompts
alike); anything else gets ``DEFAULT_RESPONSE``. Every request is recorded.

In a test::

    with StubServer({"What is 2+2?": "2+2=4\\n#### 4"}, model="stub") as server:
        server.url  # http://127.0.0.1:<port>/v1

As a process it takes ``vllm serve``'s command line, so a test can stand it in for vLLM::

    python tests/openai_stub.py serve MODEL --host 127.0.0.1 --port P --served-model-name NAME

with the table read from the JSON file named by ``$OPENAI_STUB_ANSWERS`` (or ``--answers``), and
its pid written to ``$OPENAI_STUB_PID_FILE`` if set. Unknown options are ignored.

``GarbageServer(body)`` is the opposite: a server that answers every request with HTTP 200 and
``body`` (not JSON, or JSON that is not OpenAI's), to test that clients reject it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

DEFAULT_RESPONSE = "I do not know."


def _text(content) -> str:
    """The text of a chat message's content: a string or a list of {"type": "text"} parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


class StubServer:
    """An OpenAI-compatible server on 127.0.0.1 in a background thread."""

    def __init__(
        self, answers: dict[str, str], model: str = "stub", host: str = "127.0.0.1", port: int = 0
    ):
        self.answers = dict(answers)
        self.model = model
        self.requests: list[dict] = []
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer((host, port), self._handler_class())
        self._httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return self._httpd.server_address[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def respond(self, prompt: str) -> str:
        hits = [q for q in self.answers if q in prompt]
        return self.answers[max(hits, key=len)] if hits else DEFAULT_RESPONSE

    def _handler_class(self):
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, fmt, *args):  # keep test output quiet
                pass

            def _send(self, status: int, body: dict) -> None:
                data = json.dumps(body).encode("utf-8")
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):  # noqa: N802 (http.server's naming)
                if self.path.rstrip("/") == "/v1/models":
                    model = {"id": stub.model, "object": "model", "created": 0, "owned_by": "stub"}
                    self._send(200, {"object": "list", "data": [model]})
                elif self.path.rstrip("/") in ("/health", ""):
                    self._send(200, {"status": "ok"})
                else:
                    self._send(404, {"error": {"message": f"no route {self.path}"}})

            def do_POST(self):  # noqa: N802
                if self.path.rstrip("/") != "/v1/chat/completions":
                    self._send(404, {"error": {"message": f"no route {self.path}"}})
                    return
                length = int(self.headers.get("Content-Length") or 0)
                try:
                    request = json.loads(self.rfile.read(length) or b"{}")
                except json.JSONDecodeError:
                    self._send(400, {"error": {"message": "invalid JSON"}})
                    return
                if request.get("stream"):
                    self._send(400, {"error": {"message": "the stub does not stream"}})
                    return
                if request.get("model") != stub.model:
                    message = f"The model `{request.get('model')}` does not exist."
                    self._send(404, {"error": {"message": message, "code": 404}})
                    return
                users = [m for m in request.get("messages", []) if m.get("role") == "user"]
                prompt = _text(users[-1].get("content")) if users else ""
                content = stub.respond(prompt)
                with stub._lock:
                    stub.requests.append(request)
                prompt_tokens, completion_tokens = len(prompt.split()), len(content.split())
                self._send(
                    200,
                    {
                        "id": f"chatcmpl-{uuid.uuid4().hex[:12]}",
                        "object": "chat.completion",
                        "created": int(time.time()),
                        "model": stub.model,
                        "choices": [
                            {
                                "index": 0,
                                "message": {"role": "assistant", "content": content},
                                "finish_reason": "stop",
                                "logprobs": None,
                            }
                        ],
                        "usage": {
                            "prompt_tokens": prompt_tokens,
                            "completion_tokens": completion_tokens,
                            "total_tokens": prompt_tokens + completion_tokens,
                        },
                    },
                )

        return Handler

    def start(self) -> StubServer:
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> StubServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class GarbageServer:
    """Answers every GET and POST on 127.0.0.1 with HTTP 200 and a fixed body."""

    def __init__(self, body: bytes, content_type: str = "text/html"):
        self.requests: list[str] = []

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, fmt, *args):
                pass

            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                outer.requests.append(f"{self.command} {self.path}")
                self.send_response(200)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer  # noqa: N815 (http.server's naming)

        outer = self
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def __enter__(self) -> GarbageServer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)


def main(argv: list[str] | None = None) -> int:
    """``serve MODEL --host H --port P --served-model-name NAME``, like ``vllm serve``."""
    parser = argparse.ArgumentParser(description="OpenAI-compatible stub server")
    parser.add_argument("command", choices=["serve"])
    parser.add_argument("model")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--served-model-name", default=None)
    parser.add_argument("--answers", default=os.environ.get("OPENAI_STUB_ANSWERS"))
    args, _unknown = parser.parse_known_args(argv)
    answers = {}
    if args.answers:
        with open(args.answers, encoding="utf-8") as handle:
            answers = json.load(handle)
    pid_file = os.environ.get("OPENAI_STUB_PID_FILE")
    if pid_file:
        with open(pid_file, "w", encoding="utf-8") as handle:
            handle.write(str(os.getpid()))
    server = StubServer(
        answers, model=args.served_model_name or args.model, host=args.host, port=args.port
    )
    print(f"stub serving {server.model} on http://{args.host}:{server.port}/v1", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        server._httpd.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
