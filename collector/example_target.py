"""A stand-in vLLM /metrics endpoint for trying llmslo without a GPU: `llmslo serve --example`.

It replays the bundled real vLLM scrape with every counter and histogram multiplied by a step
that grows every few seconds, so rates and quantiles are non-zero. (The workload simulator
replaces this with modelled traffic.)
"""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources

from collector.sources.expfmt import family_of, parse

SAMPLE = "vllm-0.13-sample.txt"


def sample_text() -> str:
    return resources.files("collector").joinpath("data", SAMPLE).read_text(encoding="utf-8")


def scaled_exposition(text: str, factor: int) -> str:
    """The exposition with cumulative series (counters, histograms) multiplied by `factor`."""
    expo = parse(text)
    scaled = {}
    for s in expo.samples:
        family = family_of(s.name, expo.types)
        kind = expo.types.get(family or "", "untyped")
        if kind in ("counter", "histogram") and not s.name.endswith("_created"):
            scaled[s.line] = f"{s.key} {s.value * factor!r}"
    lines = text.split("\n")
    return "\n".join(scaled.get(i, line) for i, line in enumerate(lines, 1))


class ExampleTarget:
    def __init__(self, host: str = "127.0.0.1", port: int = 0, step_seconds: float = 5.0) -> None:
        text = sample_text()
        started = time.monotonic()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path != "/metrics":
                    self.send_error(404)
                    return
                factor = 1 + int((time.monotonic() - started) // step_seconds)
                body = scaled_exposition(text, factor).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                return

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, name="example-target", daemon=True)

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}/metrics"

    def start(self) -> ExampleTarget:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
