"""Real HTTP /metrics targets on loopback for tests: healthy, failing, slow, broken."""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tests.vllm_fixtures import FAMILIES, render, workload

TEXT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass
class Behaviour:
    """What one path answers. `body` is called per request so tests can advance the workload."""

    body: Callable[[], bytes]
    status: int = 200
    content_type: str = TEXT_TYPE
    delay_seconds: float = 0.0
    gzip: bool = False
    hits: int = 0


@dataclass
class TargetServer:
    routes: dict[str, Behaviour] = field(default_factory=dict)
    server: ThreadingHTTPServer | None = None

    def url(self, path: str) -> str:
        assert self.server is not None
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}{path}"


def vllm_body(scale: Callable[[], int], model: str = "m", version: str = "0.33") -> Callable[[], bytes]:
    return lambda: render(FAMILIES[version], {(model, "0"): workload(scale())}).encode()


@contextmanager
def target_server(routes: dict[str, Behaviour]) -> Iterator[TargetServer]:
    state = TargetServer(routes)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            behaviour = state.routes.get(self.path)
            if behaviour is None:
                self.send_error(404)
                return
            behaviour.hits += 1
            if behaviour.delay_seconds:
                time.sleep(behaviour.delay_seconds)
            body = behaviour.body()
            headers = {"Content-Type": behaviour.content_type}
            if behaviour.gzip and "gzip" in (self.headers.get("Accept-Encoding") or ""):
                body = gzip.compress(body)
                headers["Content-Encoding"] = "gzip"
            try:
                self.send_response(behaviour.status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the scraper gave up (timeout): expected

        def log_message(self, format: str, *args: object) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    state.server = server
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
