"""Secrets stay secret (target URLs, database URL, configuration errors), the API can require a
read token, and a database that comes up after llmslo is waited for."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from collector.api.app import create_app
from collector.config import ConfigError, Settings, load_settings
from collector.runtime import Runtime
from collector.secrets import redact_url
from collector.store.repository import Store
from tests.conftest import PG_ADMIN_URL, require

SECRET = "s3cr3t-value-never-shown"


def test_redact_url_hides_passwords_and_secret_query_values() -> None:
    assert redact_url(f"http://bob:{SECRET}@127.0.0.1:8000/metrics?token={SECRET}&x=1") == (
        "http://bob:***@127.0.0.1:8000/metrics?token=***&x=1"
    )
    assert (
        redact_url(f"postgresql+psycopg://app:{SECRET}@db:5432/llmslo") == "postgresql+psycopg://app:***@db:5432/llmslo"
    )
    assert redact_url("http://127.0.0.1:8000/metrics") == "http://127.0.0.1:8000/metrics"


def test_target_credentials_never_reach_the_api_or_the_logs(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: connections are refused
    url = f"http://bob:{SECRET}@127.0.0.1:{port}/metrics?api_key={SECRET}"
    settings = Settings.model_validate({"data_dir": str(tmp_path), "targets": [{"name": "t", "url": url}]})
    rt = Runtime(settings)
    app = create_app(settings, rt, schedule=False)

    async def run() -> str:
        async with app.router.lifespan_context(app):
            await rt.scrape_all_once()
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://l") as client:
                return (await client.get("/api/v1/targets")).text

    with caplog.at_level(logging.WARNING):
        body = asyncio.run(run())
    assert "connect" in body and "***" in body
    assert SECRET not in body
    assert SECRET not in caplog.text and "target t down" in caplog.text


def test_configuration_errors_never_echo_a_secret(tmp_path: Path) -> None:
    cfg = tmp_path / "llmslo.yaml"
    cfg.write_text(f"server: {{api_token: short}}\ntraces: {{ingest_keys: [{{nested: {SECRET}}}]}}\n")
    with pytest.raises(ConfigError) as info:
        load_settings(cfg, environ={})
    text = "\n".join(info.value.problems)
    assert "server.api_token" in text and "traces.ingest_keys" in text
    assert "short" not in text and SECRET not in text


def test_the_database_password_is_not_printed(tmp_path: Path) -> None:
    cfg = tmp_path / "llmslo.yaml"
    cfg.write_text(f"database_url: sqlite:///{tmp_path}/x.db?password={SECRET}\n")
    out = subprocess.run(
        [sys.executable, "-m", "collector.cli", "check-config", "--config", str(cfg)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "configuration OK" in out.stdout and SECRET not in out.stdout + out.stderr


def test_an_api_token_guards_the_read_api_and_metrics_but_not_health(tmp_path: Path) -> None:
    token = "t" * 24
    settings = Settings.model_validate({"data_dir": str(tmp_path), "server": {"api_token": token}})
    app = create_app(settings, Runtime(settings), schedule=False)

    async def run() -> dict[str, int]:
        transport = httpx.ASGITransport(app=app)
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=transport, base_url="http://l") as client,
        ):
            out = {}
            for path in ("/api/v1/targets", "/metrics", "/docs", "/openapi.json", "/healthz", "/readyz"):
                out[path] = (await client.get(path)).status_code
                authorized = await client.get(path, headers={"Authorization": f"Bearer {token}"})
                out[path + " with token"] = authorized.status_code
            out["wrong"] = (await client.get("/metrics", headers={"Authorization": "Bearer nope"})).status_code
            return out

    codes = asyncio.run(run())
    for path in ("/api/v1/targets", "/metrics", "/docs", "/openapi.json"):
        assert codes[path] == 401 and codes[path + " with token"] == 200, (path, codes)
    assert codes["/healthz"] == 200 and codes["/readyz"] == 200 and codes["wrong"] == 401


def _forward_later(listen: socket.socket, delay: float, upstream: tuple[str, int]) -> None:
    """Accept on `listen` only after `delay` seconds (refused before: nobody listens), then pipe
    each connection to `upstream`: a PostgreSQL that comes up after llmslo."""
    time.sleep(delay)
    listen.listen(16)

    def pipe(a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    while True:
        try:
            client, _ = listen.accept()
        except OSError:
            return
        server = socket.create_connection(upstream)
        threading.Thread(target=pipe, args=(client, server), daemon=True).start()
        threading.Thread(target=pipe, args=(server, client), daemon=True).start()


def test_a_postgresql_that_comes_up_later_is_waited_for(pg_server: str, caplog: pytest.LogCaptureFixture) -> None:
    require(PG_ADMIN_URL.startswith("postgresql"), "needs PostgreSQL")
    listen = socket.socket()
    listen.bind(("127.0.0.1", 0))
    port = listen.getsockname()[1]
    threading.Thread(target=_forward_later, args=(listen, 3.0, ("127.0.0.1", 5432)), daemon=True).start()
    url = pg_server.replace("127.0.0.1:5432", f"127.0.0.1:{port}")
    started = time.monotonic()
    with caplog.at_level(logging.WARNING):
        store = Store(url, wait_seconds=60)
    try:
        assert time.monotonic() - started >= 2.5
        assert "not reachable" in caplog.text and "retrying" in caplog.text
        store.ping()
    finally:
        store.close()
        listen.close()


def test_a_database_that_never_answers_fails_after_the_wait(caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    started = time.monotonic()
    with pytest.raises(Exception, match=r"Connection refused|connection failed"):
        Store(f"postgresql+psycopg://postgres@127.0.0.1:{port}/x", wait_seconds=2)
    assert 1.0 <= time.monotonic() - started < 20
