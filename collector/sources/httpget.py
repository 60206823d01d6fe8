"""The scrapers' HTTP client: one keep-alive HTTP/1.1 connection per target, GET only.

A scrape is one small GET to a server that speaks HTTP/1.1 (vLLM serves /metrics from uvicorn,
exporters from Go's net/http or Python's http.server), on a connection kept open between scrapes
as Prometheus keeps one per target. At a thousand targets a general-purpose client's bookkeeping
per request (httpx over httpcore: a connection pool, the h11 state machine, anyio streams) cost
more CPU than Prometheus' whole scrape of the same target (tests/benchmarks/
test_http_floor_benchmark.py). Here the request is prepared once per target, the answer is read
by an asyncio protocol, and decompression is zlib's.

What it does: http and https (the collector's TLS context, the URL's host name for SNI and
verification), `user:password@` in the URL as basic auth, bodies framed by Content-Length, by
chunked transfer coding or by the end of the connection, gzip decoded as it arrives with the
decoded size bounded (a small compressed body cannot expand past the limit), keep-alive unless
the server says close, and one retry on a new connection when a kept connection turns out to have
been closed by the server (uvicorn closes idle ones after 5 s). What it does not: redirects (a
target that answers one is down with its status, as before), proxies, HTTP/2.
"""

from __future__ import annotations

import asyncio
import base64
import ssl
import zlib
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from collector import conventions as conv

MAX_HEAD_BYTES = 64 * 1024  # status line and headers; more is not an HTTP server we should trust


class FetchError(Exception):
    """The exchange failed; `reason` is a scrape error reason (connect, too_large)."""

    def __init__(self, reason: str, message: str) -> None:
        self.reason = reason
        self.message = message
        super().__init__(message)


class _Dropped(FetchError):
    """A kept connection was closed by the server before any byte of the answer: safe to retry."""


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    headers: dict[str, str]  # lower-case names
    body: bytes  # decoded (gzip undone); empty unless status is 200


class _Connection(asyncio.Protocol):
    """The bytes of one connection, handed to the reading coroutine as they arrive."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.eof = False
        self.error: BaseException | None = None
        self.waiter: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        self._wake()

    def eof_received(self) -> bool:
        self.eof = True
        self._wake()
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.eof = True
        self.error = exc
        self._wake()

    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def more(self) -> bool:
        """Wait for more bytes; False when the connection has ended."""
        if self.eof:
            return False
        self.waiter = asyncio.get_running_loop().create_future()
        try:
            await self.waiter
        finally:
            self.waiter = None
        return True

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
        self.eof = True


class Target:
    """GET one URL over a kept connection. Not for concurrent use: a target has one scrape at a time."""

    def __init__(self, url: str, headers: dict[str, str], tls: ssl.SSLContext | None = None) -> None:
        self.url = url
        self.headers = headers
        self.given_tls = tls
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("expected an http:// or https:// URL")
        self.https = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port or (443 if self.https else 80)
        self.tls = (tls or ssl.create_default_context()) if self.https else None
        host_header = f"[{self.host}]" if ":" in self.host else self.host
        if parts.port is not None:
            host_header += f":{parts.port}"
        lines = [f"GET {parts.path or '/'}{'?' + parts.query if parts.query else ''} HTTP/1.1", f"Host: {host_header}"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        if parts.username is not None:
            secret = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
            lines.append(f"Authorization: Basic {base64.b64encode(secret).decode()}")
        self.request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        self.conn: _Connection | None = None

    async def get(self, limit: int) -> Answer:
        """One GET; the body (decoded) may hold at most `limit` bytes. Cancel it to time it out."""
        conn = self.conn
        if conn is not None and not conn.eof:
            try:
                return await self._exchange(conn, limit, kept=True)
            except _Dropped:
                pass  # closed by the server while idle: once more, on a new connection
        return await self._exchange(await self._connect(), limit, kept=False)

    def to(self, url: str) -> Target:
        """The same client for another URL (a target pointed elsewhere), on a connection of its own."""
        return Target(url, self.headers, self.given_tls)

    async def aclose(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            _, conn = await loop.create_connection(
                _Connection, self.host, self.port, ssl=self.tls, server_hostname=self.host if self.https else None
            )
        except (OSError, ssl.SSLError) as exc:
            raise FetchError(conv.REASON_CONNECT, f"{type(exc).__name__}: {exc}") from None
        self.conn = conn
        return conn

    async def _exchange(self, conn: _Connection, limit: int, kept: bool) -> Answer:
        done = False
        try:
            assert conn.transport is not None
            conn.buffer.clear()
            conn.transport.write(self.request)
            answer, reusable = await _read_answer(conn, limit, kept)
            done = reusable
            return answer
        except FetchError:
            raise
        except (OSError, ssl.SSLError) as exc:
            if kept and not conn.buffer:
                raise _Dropped(conv.REASON_CONNECT, f"{type(exc).__name__}: {exc}") from None
            raise FetchError(conv.REASON_CONNECT, f"{type(exc).__name__}: {exc}") from None
        finally:
            if not done:  # an error, a timeout (cancelled), or a server that said close
                conn.close()
                if self.conn is conn:
                    self.conn = None


async def _read_answer(conn: _Connection, limit: int, kept: bool) -> tuple[Answer, bool]:
    """(the answer, whether the connection can carry the next request)."""
    buf = conn.buffer
    end = buf.find(b"\r\n\r\n")
    while end < 0:
        if len(buf) > MAX_HEAD_BYTES:
            raise FetchError(conv.REASON_CONNECT, f"no end of the HTTP headers within {MAX_HEAD_BYTES} bytes")
        if not await conn.more():
            if kept and not buf:
                raise _Dropped(conv.REASON_CONNECT, "the server closed the kept connection without answering")
            if conn.error is not None:
                raise FetchError(conv.REASON_CONNECT, f"{type(conn.error).__name__}: {conn.error}")
            raise FetchError(conv.REASON_CONNECT, "the server closed the connection before the end of the HTTP headers")
        end = buf.find(b"\r\n\r\n")
    head = bytes(buf[:end]).decode("latin-1")
    del buf[: end + 4]
    status_line, *header_lines = head.split("\r\n")
    version, _, rest = status_line.partition(" ")
    code = rest[:3]
    if not version.startswith("HTTP/1.") or not code.isdigit():
        raise FetchError(conv.REASON_CONNECT, f"not an HTTP/1.x answer: {status_line[:80]!r}")
    headers: dict[str, str] = {}
    for line in header_lines:
        name, sep, value = line.partition(":")
        if not sep:
            raise FetchError(conv.REASON_CONNECT, f"malformed HTTP header line {line[:80]!r}")
        name = name.strip().lower()
        value = value.strip()
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    status = int(code)
    keep_alive = version == "HTTP/1.1" and "close" not in headers.get("connection", "").lower()
    if status != 200:
        return Answer(status, headers, b""), False  # its body is not read: the connection is not reused
    declared = headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise FetchError(conv.REASON_TOO_LARGE, f"body of {declared} bytes exceeds the limit of {limit} bytes")
    coding = headers.get("content-encoding", "identity").lower()
    if coding not in ("identity", "gzip", "x-gzip"):
        raise FetchError(conv.REASON_CONNECT, f"unsupported Content-Encoding {coding!r} (llmslo asks for gzip or none)")
    body = _Body(limit, gzip=coding != "identity")
    if "chunked" in headers.get("transfer-encoding", "").lower():
        await _read_chunked(conn, body)
    elif declared is not None:
        if not declared.isdigit():
            raise FetchError(conv.REASON_CONNECT, f"malformed Content-Length {declared[:40]!r}")
        await _read_length(conn, body, int(declared))
    else:
        keep_alive = False  # the body ends with the connection
        while True:
            body.add(bytes(buf))
            buf.clear()
            if not await conn.more():
                if buf:
                    continue
                break
        if conn.error is not None:
            raise FetchError(conv.REASON_CONNECT, f"{type(conn.error).__name__}: {conn.error} (inside the body)")
    return Answer(status, headers, body.finish()), keep_alive


async def _read_length(conn: _Connection, body: _Body, length: int) -> None:
    buf = conn.buffer
    while length > 0:
        if not buf and not await conn.more():
            raise FetchError(conv.REASON_CONNECT, f"the connection ended {length} bytes before the end of the body")
        take = min(length, len(buf))
        body.add(bytes(buf[:take]))
        del buf[:take]
        length -= take


async def _read_chunked(conn: _Connection, body: _Body) -> None:
    buf = conn.buffer
    while True:
        line = await _read_line(conn)
        size_text = line.split(b";", 1)[0].strip()
        try:
            size = int(size_text, 16)
        except ValueError:
            raise FetchError(conv.REASON_CONNECT, f"malformed chunk size {size_text[:20]!r}") from None
        if size == 0:
            while await _read_line(conn):  # trailers, up to the empty line
                pass
            return
        await _read_length(conn, body, size)
        while len(buf) < 2:
            if not await conn.more():
                raise FetchError(conv.REASON_CONNECT, "the connection ended inside a chunked body")
        if buf[:2] != b"\r\n":
            raise FetchError(conv.REASON_CONNECT, "a chunk does not end with CRLF")
        del buf[:2]


async def _read_line(conn: _Connection) -> bytes:
    buf = conn.buffer
    while (end := buf.find(b"\r\n")) < 0:
        if len(buf) > MAX_HEAD_BYTES or not await conn.more():
            raise FetchError(conv.REASON_CONNECT, "the connection ended inside a chunked body")
    line = bytes(buf[:end])
    del buf[: end + 2]
    return line


class _Body:
    """The body as it arrives, gzip undone; more than `limit` decoded bytes is an error."""

    def __init__(self, limit: int, gzip: bool) -> None:
        self.limit = limit
        self.size = 0
        self.parts: list[bytes] = []
        self.zlib = zlib.decompressobj(16 + zlib.MAX_WBITS) if gzip else None

    def add(self, data: bytes) -> None:
        if not data:
            return
        if self.zlib is not None:
            data = self.zlib.decompress(data, self.limit + 1 - self.size)
            if self.zlib.unconsumed_tail:
                self._too_large()
        self.size += len(data)
        if self.size > self.limit:
            self._too_large()
        self.parts.append(data)

    def finish(self) -> bytes:
        if self.zlib is not None:
            if not self.zlib.eof:
                raise FetchError(conv.REASON_CONNECT, "the gzip body ends before its end")
            if self.zlib.unused_data:
                raise FetchError(conv.REASON_CONNECT, "data after the end of the gzip body")
        return b"".join(self.parts)

    def _too_large(self) -> None:
        raise FetchError(conv.REASON_TOO_LARGE, f"body exceeds the limit of {self.limit} bytes (after decompression)")
