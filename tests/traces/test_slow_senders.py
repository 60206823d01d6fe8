"""Slow uploads cannot hold the ingest slots: bodies are read, within a timeout, before a slot
is taken (as the OpenTelemetry Collector's HTTP server bounds reads)."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import httpx

from collector.api.app import create_app
from collector.config import Settings
from tests.embedded import serving
from tests.real_vllm.conftest import free_port
from tests.traces.test_ingest import good_json


def test_slow_senders_hold_no_slot_and_a_short_body_is_answered_408(tmp_path: Path) -> None:
    port = free_port()
    settings = Settings.model_validate(
        {"data_dir": str(tmp_path), "traces": {"max_concurrent_batches": 2, "body_read_timeout": "3s"}}
    )
    head = (
        b"POST /v1/traces HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
    )
    slow = []
    with serving(create_app(settings, schedule=False), port):
        for _ in range(4):  # twice as many as there are slots, dribbling one byte at a time
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall(head + b"{")
            slow.append(s)
        time.sleep(0.5)
        started = time.monotonic()
        ok = httpx.post(
            f"http://127.0.0.1:{port}/v1/traces", content=good_json(7), headers={"Content-Type": "application/json"}
        )
        assert ok.status_code == 200, ok.text
        assert time.monotonic() - started < 2.0
        # the short bodies (1 byte of a declared 1,000) are answered 408 once the timeout passes
        for s in slow:
            s.settimeout(10)
            answer = s.recv(4096).decode(errors="replace")
            assert answer.startswith("HTTP/1.1 408"), answer
        for s in slow:
            s.close()
