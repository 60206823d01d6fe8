"""uvicorn servers run inside an existing event loop (replicas, the demo, a second OTLP port)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import uvicorn


class EmbeddedServer(uvicorn.Server):
    """uvicorn without its own signal handlers: Ctrl-C belongs to whoever owns the loop."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield
