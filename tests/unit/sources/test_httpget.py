"""The scrapers' HTTP client (collector/sources/httpget.py) against real servers on loopback:
uvicorn (what vLLM serves /metrics from) with keep-alive and its idle timeout, TLS, and raw
servers for each framing (Content-Length, chunked with trailers, the end of the connection) and
each way an answer can go wrong (truncated, too large before and after gzip, not HTTP)."""

from __future__ import annotations

import asyncio
import gzip
import os
import shutil
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from collector.sources.httpget import FetchError, Target
from collector.sources.scrape import request_headers
from tests.vllm_fixtures import FAMILIES, render, workload

BODY = render(FAMILIES["0.33"], {("m", "0"): workload(3)}).encode()
HEADERS = request_headers(10.0)

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def raw_server(handle: Handler, tls: ssl.SSLContext | None = None) -> tuple[asyncio.Server, int]:
    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=tls)
    return server, server.sockets[0].getsockname()[1]


def answering(*answers: bytes, connections: list[int] | None = None) -> Handler:
    """A server that answers each request on a connection with the next of `answers`, then closes."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if connections is not None:
            connections.append(1)
        try:
            for answer in answers:
                await reader.readuntil(b"\r\n\r\n")
                writer.write(answer)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    return handle


def ok(body: bytes, *headers: str) -> bytes:
    head = ["HTTP/1.1 200 OK", "Content-Type: text/plain; version=0.0.4", f"Content-Length: {len(body)}", *headers]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


@contextmanager
def uvicorn_server(seen: list[Request], keep_alive_seconds: int = 5) -> Iterator[str]:
    async def metrics(request: Request) -> Response:
        seen.append(request)
        body, headers = BODY, {"content-type": "text/plain; version=0.0.4; charset=utf-8"}
        if "gzip" in request.headers.get("accept-encoding", ""):
            body, headers = gzip.compress(BODY), {**headers, "content-encoding": "gzip"}
        return Response(body, headers=headers)

    port = free_port()
    app = Starlette(routes=[Route("/metrics", metrics)])
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error", timeout_keep_alive=keep_alive_seconds)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}/metrics"
    finally:
        server.should_exit = True
        thread.join(10)


def test_uvicorn_answers_every_scrape_on_one_kept_connection_and_after_it_closed_an_idle_one() -> None:
    seen: list[Request] = []
    with uvicorn_server(seen, keep_alive_seconds=1) as url:

        async def run() -> list[bytes]:
            target = Target(url, HEADERS)
            bodies = [(await target.get(10_000_000)).body for _ in range(3)]
            await asyncio.sleep(1.5)  # uvicorn closes the idle connection meanwhile
            bodies.append((await target.get(10_000_000)).body)
            await target.aclose()
            return bodies

        bodies = asyncio.run(run())
    assert bodies == [BODY] * 4  # gzip undone
    clients = [r.client for r in seen]
    assert clients[0] == clients[1] == clients[2] != clients[3]  # one connection, then a new one
    assert seen[0].headers["x-prometheus-scrape-timeout-seconds"] == "10"
    assert seen[0].headers["accept-encoding"] == "gzip" and seen[0].headers["host"].startswith("127.0.0.1:")


def test_chunked_gzip_with_trailers_and_a_close_delimited_body_are_read_whole() -> None:
    zipped = gzip.compress(BODY)
    chunks = b"".join(
        b"%x;ext=1\r\n%s\r\n" % (len(zipped[i : i + 700]), zipped[i : i + 700]) for i in range(0, len(zipped), 700)
    )
    chunked = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Encoding: gzip\r\n\r\n"
        + chunks
        + b"0\r\nX-Trailer: yes\r\n\r\n"
    )
    close_delimited = b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n" + BODY

    async def run() -> tuple[list[bytes], int]:
        connections: list[int] = []
        server, port = await raw_server(answering(chunked, chunked, connections=connections))
        target = Target(f"http://127.0.0.1:{port}/metrics", HEADERS)
        got = [(await target.get(10_000_000)).body for _ in range(2)]
        server.close()
        server, port = await raw_server(answering(close_delimited))
        got.append((await Target(f"http://127.0.0.1:{port}/", HEADERS).get(10_000_000)).body)
        server.close()
        return got, len(connections)

    got, connections = asyncio.run(run())
    assert got == [BODY, BODY, BODY]
    assert connections == 1  # the chunked answers kept the connection


@pytest.mark.parametrize(
    ("answer", "reason", "words"),
    [
        (ok(b"x" * 2000), "too_large", "body of 2000 bytes exceeds the limit of 1000"),
        (ok(gzip.compress(b"a 1\n" * 100_000), "Content-Encoding: gzip"), "too_large", "after decompression"),
        (ok(BODY)[:-100], "connect", "before the end of the body"),
        (b"SSH-2.0-OpenSSH_9.2\r\n\r\n", "connect", "not an HTTP/1.x answer"),
        (ok(b"abc", "Content-Encoding: br"), "connect", "unsupported Content-Encoding 'br'"),
        (b"HTTP/1.1 200 OK\r\n" + b"X-A: " + b"a" * 70_000, "connect", "no end of the HTTP headers"),
    ],
)
def test_a_bad_answer_is_an_error_that_names_what_was_wrong(answer: bytes, reason: str, words: str) -> None:
    async def run() -> FetchError:
        server, port = await raw_server(answering(answer))
        target = Target(f"http://127.0.0.1:{port}/metrics", HEADERS)
        with pytest.raises(FetchError) as info:
            await target.get(1000 if reason == "too_large" and "2000" in words else 100_000)
        server.close()
        return info.value

    error = asyncio.run(run())
    assert error.reason == reason and words in error.message


def test_a_refused_connection_a_non_200_answer_and_a_timeout() -> None:
    async def run() -> None:
        with pytest.raises(FetchError, match="Connect") as info:
            await Target(f"http://127.0.0.1:{free_port()}/metrics", HEADERS).get(1000)
        assert info.value.reason == "connect"
        server, port = await raw_server(answering(b"HTTP/1.1 503 Busy\r\nContent-Length: 4\r\n\r\nbusy"))
        answer = await Target(f"http://127.0.0.1:{port}/metrics", HEADERS).get(1000)
        assert answer.status == 503 and answer.body == b""
        server.close()

        async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await asyncio.sleep(5)
            writer.close()

        server, port = await raw_server(silent)
        target = Target(f"http://127.0.0.1:{port}/metrics", HEADERS)
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.3):
                await target.get(1000)
        assert time.monotonic() - started < 1.0 and target.conn is None  # the connection was dropped
        server.close()

    asyncio.run(run())


def test_basic_auth_from_the_url_and_a_query_string_reach_the_server() -> None:
    requests: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        requests.append(await reader.readuntil(b"\r\n\r\n"))
        writer.write(ok(BODY))
        await writer.drain()
        writer.close()

    async def run() -> bytes:
        server, port = await raw_server(handle)
        body = (await Target(f"http://bob:p%40ss@127.0.0.1:{port}/m?x=1", HEADERS).get(100_000)).body
        server.close()
        return body

    assert asyncio.run(run()) == BODY
    head = requests[0].decode()
    assert head.startswith("GET /m?x=1 HTTP/1.1\r\n")
    assert "Authorization: Basic Ym9iOnBAc3M=\r\n" in head  # bob:p@ss


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    if shutil.which("openssl") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("openssl is not installed (apt-get install openssl)")
        pytest.skip("openssl is not installed (Debian: apt-get install openssl)")
    where = tmp_path_factory.mktemp("tls")
    cert, key = where / "cert.pem", where / "key.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1"),
            *("-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


def test_https_verifies_the_server_and_keeps_the_connection(certificate: tuple[Path, Path]) -> None:
    cert, key = certificate
    server_tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_tls.load_cert_chain(cert, key)
    trusting = ssl.create_default_context(cafile=str(cert))

    async def run() -> None:
        connections: list[int] = []
        server, port = await raw_server(answering(ok(BODY), ok(BODY), connections=connections), tls=server_tls)
        target = Target(f"https://127.0.0.1:{port}/metrics", HEADERS, trusting)
        assert [(await target.get(100_000)).body for _ in range(2)] == [BODY, BODY]
        assert connections == [1]
        await target.aclose()
        with pytest.raises(FetchError, match="CERTIFICATE_VERIFY_FAILED") as info:
            await Target(f"https://127.0.0.1:{port}/metrics", HEADERS, ssl.create_default_context()).get(100_000)
        assert info.value.reason == "connect"
        server.close()

    asyncio.run(run())
