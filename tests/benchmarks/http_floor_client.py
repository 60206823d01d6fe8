"""An HTTP client alone, one keep-alive connection per target, gzip accepted and decoded, scrape
offsets spread over the interval: GET every target's /metrics every interval and keep the body,
nothing else. `llmslo` is the scrapers' own client (collector/sources/httpget.py), `httpx` one
httpx.AsyncClient per target as the scrapers used before. Its CPU per request is the floor under
llmslo's CPU per scrape that no parsing, storage or derived view can lower.

Run: python -m tests.benchmarks.http_floor_client URL_TEMPLATE N SECONDS [llmslo|httpx]
(URL_TEMPLATE has {i}); after a first interval of warm-up (connections opened), prints "done
<requests> <errors> <cpu seconds>" for the rest of the run.
"""

from __future__ import annotations

import asyncio
import resource
import ssl
import sys
import time

import certifi
import httpx

from collector.sources.httpget import FetchError, Target
from collector.sources.scrape import request_headers

INTERVAL = 15.0


async def main(template: str, n: int, seconds: float, kind: str) -> None:
    limits = httpx.Limits(max_connections=2, max_keepalive_connections=1, keepalive_expiry=2 * INTERVAL + 5)
    tls = ssl.create_default_context(cafile=certifi.where())  # one context shared, as llmslo's
    if kind == "httpx":
        clients = [
            httpx.AsyncClient(follow_redirects=False, trust_env=False, verify=tls, limits=limits) for _ in range(n)
        ]

        async def get(i: int) -> bytes:
            response = await clients[i].get(template.format(i=i), timeout=10)
            return response.content  # read and gunzipped

    else:
        targets = [Target(template.format(i=i), request_headers(10.0), tls) for i in range(n)]

        async def get(i: int) -> bytes:
            async with asyncio.timeout(10):
                return (await targets[i].get(10 * 1024 * 1024)).body

    end = time.monotonic() + seconds
    measured_from = time.monotonic() + INTERVAL
    done = errors = 0
    cpu0: list[float] = []

    def cpu() -> float:
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime

    async def warm() -> None:
        await asyncio.sleep(INTERVAL)
        cpu0.append(cpu())

    async def target(i: int) -> None:
        nonlocal done, errors
        await asyncio.sleep(INTERVAL * i / n)  # offsets spread over the interval, as llmslo's
        while time.monotonic() < end:
            started = time.monotonic()
            try:
                await get(i)
                done += started >= measured_from
            except (httpx.HTTPError, FetchError, TimeoutError):
                errors += 1
            await asyncio.sleep(max(0.0, INTERVAL - (time.monotonic() - started)))

    await asyncio.gather(warm(), *(target(i) for i in range(n)))
    spent = cpu() - cpu0[0]
    if kind == "httpx":
        for c in clients:
            await c.aclose()
    print(f"done {done} {errors} {spent}", flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4] if len(sys.argv) > 4 else "llmslo"))
