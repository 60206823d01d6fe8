"""`llmslo`'s app served on a loopback port in a thread, for tests that need real HTTP."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn
from fastapi import FastAPI

from collector.api.embedded import EmbeddedServer


@contextmanager
def serving(app: FastAPI, port: int) -> Iterator[EmbeddedServer]:
    """Serve `app` on 127.0.0.1:`port` until the block ends (lifespan, scheduler and all)."""
    server = EmbeddedServer(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"llmslo did not start on port {port}")
        time.sleep(0.05)
    try:
        yield server
    finally:
        server.should_exit = True
        thread.join(timeout=15)


def free_port() -> int:
    """A loopback port nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
