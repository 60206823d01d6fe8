"""Scraping real loopback HTTP targets: one bad target never affects the others."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from collector.config import Settings, TargetConfig
from collector.runtime import Runtime
from tests.targets import Behaviour, target_server, vllm_body


def settings_for(
    tmp_path: Path, urls: dict[str, str], slow: tuple[str, ...] = (), interval: float = 3.0, **scrape: object
) -> Settings:
    """Every target gets 2 s (a loaded CI machine), except those in `slow`: 0.5 s."""
    targets = [
        TargetConfig(
            name=n, url=u, timeout=0.5 if n in slow else min(2.0, interval), interval=interval, business_type="chat"
        )
        for n, u in urls.items()
    ]
    return Settings.model_validate(
        {
            "data_dir": str(tmp_path),
            "targets": [t.model_dump() for t in targets],
            "scrape": {"interval": interval, "timeout": min(2.0, interval), **scrape},
        }
    )


def test_healthy_failing_slow_and_broken_targets_side_by_side(tmp_path: Path) -> None:
    scale = {"n": 1}
    big = b"# TYPE a gauge\n" + b"a 1\n" * 400_000
    routes = {
        "/ok": Behaviour(vllm_body(lambda: scale["n"])),
        "/ok-gzip": Behaviour(vllm_body(lambda: scale["n"], model="g"), gzip=True),
        "/500": Behaviour(lambda: b"oops", status=500),
        "/slow": Behaviour(vllm_body(lambda: scale["n"]), delay_seconds=2.0),
        "/garbage": Behaviour(lambda: b'vllm:num_requests_running{model_name="m" 1\n'),
        "/html": Behaviour(lambda: b"<html></html>", content_type="text/html"),
        "/latin1": Behaviour(lambda: b"# HELP x caf\xe9\nx 1\n"),
        "/big": Behaviour(lambda: big),
    }
    with target_server(routes) as srv:
        names = {path.strip("/"): srv.url(path) for path in routes}
        settings = settings_for(tmp_path, names, slow=("slow",), max_body_bytes=1_000_000)

        async def run() -> Runtime:
            rt = Runtime(settings)
            await rt.start()
            started = time.perf_counter()
            await rt.scrape_all_once()
            # the slow target (2 s) is cut at its 0.5 s timeout; nothing waits for it
            assert time.perf_counter() - started < 1.8  # the 2 s target was cut at 0.5 s
            scale["n"] = 3
            await rt.scrape_all_once()
            return rt

        rt = asyncio.run(run())
    st = {n: s.status for n, s in rt.scrapers.items()}
    assert st["ok"].up and st["ok-gzip"].up
    assert st["500"].last_error_reason == "http_status" and "HTTP 500" in (st["500"].last_error or "")
    assert st["slow"].last_error_reason == "timeout"
    assert st["garbage"].last_error_reason == "parse" and (st["garbage"].last_error or "").startswith("line 1:")
    assert st["html"].last_error_reason == "content_type"
    assert st["latin1"].last_error_reason == "encoding" and "line 1" in (st["latin1"].last_error or "")
    assert st["big"].last_error_reason == "too_large"
    assert st["500"].errors_total["http_status"] == 2 and st["500"].consecutive_failures == 2

    report = rt.report(300.0, time.time())
    by_target = {g.target: g.stats for g in report.groups}
    assert set(by_target) == {"ok", "ok-gzip"}  # nothing stored for the broken ones
    assert by_target["ok"].requests == 40.0 and by_target["ok-gzip"].requests == 40.0
    rt.store.close()


def test_a_target_that_breaks_keeps_what_was_stored(tmp_path: Path) -> None:
    scale = {"n": 1}
    broken = {"on": False}

    def body() -> bytes:
        text = vllm_body(lambda: scale["n"])()
        return text.replace(b"vllm:prompt_tokens_total{", b"vllm:prompt_tokens_total{{") if broken["on"] else text

    with target_server({"/m": Behaviour(body)}) as srv:
        settings = settings_for(tmp_path, {"t": srv.url("/m")})

        async def run() -> Runtime:
            rt = Runtime(settings)
            await rt.start()
            await rt.scrape_all_once()
            scale["n"] = 2
            await rt.scrape_all_once()
            broken["on"] = True
            scale["n"] = 5
            await rt.scrape_all_once()
            return rt

        rt = asyncio.run(run())
    status = rt.scrapers["t"].status
    assert not status.up and status.last_error_reason == "parse"
    assert "malformed label set" in (status.last_error or "")
    stats = rt.report(300.0, time.time()).groups[0].stats
    assert stats.requests == 20.0  # the broken scrape changed nothing already stored
    assert rt.scrapers["t"].tracker.baseline_unix == status.last_success_unix
    rt.store.close()


def test_backoff_skips_scheduled_scrapes_after_failures(tmp_path: Path) -> None:
    """A target that was up and fails backs off exponentially (one that never was up does not)."""
    with target_server({"/500": Behaviour(vllm_body(lambda: 1))}) as srv:
        settings = settings_for(tmp_path, {"t": srv.url("/500")}, interval=1.0)
        now = {"t": 1000.0}

        async def run() -> Runtime:
            rt = Runtime(settings)
            await rt.start()
            scraper = rt.scrapers["t"]
            assert await scraper.scrape_once(clock=lambda: now["t"])
            srv.routes["/500"].status = 500
            for _ in range(3):
                await scraper.run_scheduled(clock=lambda: now["t"])
                now["t"] += 1.0
            # failures 1, 2, 3 -> waits of 0, 1 and 3 intervals: the next tick (1 s later) is skipped
            hits = srv.routes["/500"].hits
            await scraper.run_scheduled(clock=lambda: now["t"])
            assert srv.routes["/500"].hits == hits
            now["t"] += 3.0
            await scraper.run_scheduled(clock=lambda: now["t"])
            assert srv.routes["/500"].hits == hits + 1
            return rt

        rt = asyncio.run(run())
    assert rt.scrapers["t"].status.consecutive_failures == 4
    rt.store.close()


@pytest.mark.parametrize("reason", ["connect"])
def test_a_refused_connection_is_a_connect_error(tmp_path: Path, reason: str) -> None:
    settings = settings_for(tmp_path, {"t": "http://127.0.0.1:9/metrics"})

    async def run() -> Runtime:
        rt = Runtime(settings)
        await rt.start()
        await rt.scrape_all_once()
        return rt

    rt = asyncio.run(run())
    assert rt.scrapers["t"].status.last_error_reason == reason
    rt.store.close()


def test_a_keep_alive_connection_the_server_dropped_is_retried_once(tmp_path: Path) -> None:
    """A server that answers the first request on a connection and drops the connection on the
    next one, without a response (an idle keep-alive closed just as the scraper reuses it, as
    uvicorn does after 5 s): every scrape still succeeds, on a new connection. A server that drops
    every request is still down, with the connection error."""
    from tests.vllm_fixtures import FAMILIES, render, workload

    body = render(FAMILIES["0.33"], {("m", "0"): workload(1)}).encode()
    connections = {"n": 0}

    async def serve(drop_all: bool) -> asyncio.base_events.Server:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            connections["n"] += 1
            served = 0
            try:
                while True:
                    await reader.readuntil(b"\r\n\r\n")
                    if served >= 1 or drop_all:
                        return  # closes without a response
                    served += 1
                    writer.write(
                        b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: "
                        + str(len(body)).encode()
                        + b"\r\n\r\n"
                        + body
                    )
                    await writer.drain()
            except (asyncio.IncompleteReadError, ConnectionError):
                pass
            finally:
                writer.close()

        return await asyncio.start_server(handle, "127.0.0.1", 0)

    async def run(drop_all: bool) -> Runtime:
        server = await serve(drop_all)
        port = server.sockets[0].getsockname()[1]
        rt = Runtime(settings_for(tmp_path / str(drop_all), {"t": f"http://127.0.0.1:{port}/metrics"}))
        await rt.start()
        for _ in range(4):
            await rt.scrape_all_once()
        server.close()
        await rt.close()
        return rt

    rt = asyncio.run(run(drop_all=False))
    status = rt.scrapers["t"].status
    assert status.scrapes_total == 4 and sum(status.errors_total.values()) == 0 and status.up
    assert connections["n"] >= 4  # each reuse was dropped and retried on a new connection
    rt = asyncio.run(run(drop_all=True))
    status = rt.scrapers["t"].status
    assert not status.up and status.last_error_reason == "connect"
