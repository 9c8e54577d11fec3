"""An OpenAI-compatible stub server (stdlib): /v1/models and chat completions answered from
``answers`` ({question: a response, or a whole message}), each request recorded; ``body``: that
body to everything. As a process it stands in for vllm serve ($OPENAI_STUB_ANSWERS,
$OPENAI_STUB_PID_FILE, $OPENAI_STUB_DELAY)."""

import argparse
import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


class StubServer:
    def __init__(self, answers: dict[str, str], model: str = "stub", port: int = 0,
                 body: bytes | None = None, delay: float = 0.0):  # fmt: skip
        self.answers, self.model, self.requests = answers, model, []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _send(self, status: int, reply: dict | bytes) -> None:
                data = reply if isinstance(reply, bytes) else json.dumps(reply).encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):  # noqa: N802 (http.server's naming)
                if body is not None:
                    return self._send(200, body)
                models = {"object": "list", "data": [{"id": stub.model, "object": "model"}]}
                self._send(200 if self.path.rstrip("/") == "/v1/models" else 404, models)

            def do_POST(self):  # noqa: N802
                request = json.loads(self.rfile.read(int(self.headers["Content-Length"] or 0)))
                if body is not None:
                    return self._send(200, body)
                if request.get("model") != stub.model:
                    return self._send(404, {"error": {"message": "no such model"}})
                stub.requests.append(request)
                prompt = request["messages"][-1]["content"]
                prompt = prompt if isinstance(prompt, str) else prompt[0]["text"]
                print(f"stub: answering a request for {stub.model}", flush=True)
                time.sleep(delay)
                hits = [q for q in stub.answers if q in prompt]
                content = stub.answers[max(hits, key=len)] if hits else "I do not know."
                plain = {"role": "assistant", "content": content}
                message = content if isinstance(content, dict) else plain
                choice = {"index": 0, "message": message, "finish_reason": "stop"}
                usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
                reply = {"id": "stub", "object": "chat.completion", "model": stub.model,
                         "created": 0, "usage": usage, "choices": [choice]}  # fmt: skip
                self._send(200, reply)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __enter__(self) -> "StubServer":
        serve = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        serve.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


if __name__ == "__main__":  # serve MODEL --port P --served-model-name NAME ..., as vllm serve
    parser = argparse.ArgumentParser()
    for name in ("command", "model", "--served-model-name", "--port"):
        parser.add_argument(name)
    args = parser.parse_known_args()[0]
    Path(os.environ["OPENAI_STUB_PID_FILE"]).write_text(str(os.getpid()))
    answers = json.loads(Path(os.environ["OPENAI_STUB_ANSWERS"]).read_text())
    delay = float(os.environ.get("OPENAI_STUB_DELAY", "0"))
    stub = StubServer(answers, args.served_model_name, int(args.port), delay=delay)
    print(f"stub serving {stub.model} on {stub.url}", flush=True)
    stub.httpd.serve_forever()
