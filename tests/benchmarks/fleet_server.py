"""A loopback fleet of vLLM /metrics targets for the fleet benchmark: one process answering
`/t/<i>/metrics` for any i with a current-vLLM body (the simulator's naming family, one model)
whose counters and histograms advance every 5 s, gzip-compressed when asked.

Run: python -m tests.benchmarks.fleet_server --port 18000 (prints "ready <port>" when listening).
Bodies are rendered once per step and shared by every target, so the server's cost per request is
a dictionary lookup and a socket write; it runs in its own process, so its CPU is not counted as
the scrapers'.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import random
import time

from collector.sim.exposition import EngineMetrics, render

STEP_SECONDS = 5.0
MODEL = "Qwen/Qwen3-8B"


class Bodies:
    def __init__(self) -> None:
        self.started = time.time()
        self.metrics = EngineMetrics(max_model_len=8192, created_unix=self.started - 3600)
        self.rng = random.Random(7)
        self.step = -1
        self.plain = b""
        self.gzipped = b""
        self.advance()

    def advance(self) -> None:
        step = int((time.time() - self.started) // STEP_SECONDS)
        if step == self.step:
            return
        m, rng = self.metrics, self.rng
        for _ in range(max(1, step - self.step) * 40):  # ~8 requests/s
            prompt, output = rng.randint(50, 3000), rng.randint(20, 800)
            m.prompt_tokens += prompt
            m.generation_tokens += output
            m.prefix_queries += prompt
            m.prefix_hits += prompt // 3
            reason = "stop" if rng.random() < 0.97 else rng.choice(["length", "abort", "error"])
            m.finished[reason] = m.finished.get(reason, 0) + 1
            ttft = rng.lognormvariate(-2.0, 0.7)
            itl = rng.lognormvariate(-3.5, 0.3)
            queue = rng.expovariate(20)
            for name, value in (
                ("time_to_first_token_seconds", ttft),
                ("inter_token_latency_seconds", itl),
                ("request_time_per_output_token_seconds", itl),
                ("e2e_request_latency_seconds", ttft + itl * output),
                ("request_queue_time_seconds", queue),
                ("request_inference_time_seconds", ttft + itl * output - queue),
                ("request_prefill_time_seconds", ttft - queue if ttft > queue else ttft),
                ("request_decode_time_seconds", itl * output),
                ("request_prompt_tokens", prompt),
                ("request_generation_tokens", output),
                ("request_max_num_generation_tokens", output),
                ("request_params_max_tokens", 1024),
                ("request_params_n", 1),
                ("iteration_tokens_total", rng.randint(1, 512)),
            ):
                m.hist[name].observe(value)
        m.running, m.waiting, m.kv_usage = rng.randint(0, 16), rng.randint(0, 3), rng.random() * 0.6
        self.step = step
        self.plain = render("current", MODEL, m, num_gpu_blocks=4096).encode()
        self.gzipped = gzip.compress(self.plain, compresslevel=1)


async def serve(port: int) -> None:
    bodies = Bodies()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                request_line, _, rest = head.partition(b"\r\n")
                path = request_line.split(b" ")[1] if b" " in request_line else b""
                bodies.advance()
                if not (path.startswith(b"/t/") and path.endswith(b"/metrics")):
                    writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
                else:
                    gz = b"gzip" in rest.lower()
                    body = bodies.gzipped if gz else bodies.plain
                    extra = b"Content-Encoding: gzip\r\n" if gz else b""
                    writer.write(
                        b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
                        + extra
                        + b"Content-Length: "
                        + str(len(body)).encode()
                        + b"\r\n\r\n"
                        + body
                    )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", port, backlog=4096)
    print(f"ready {server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    asyncio.run(serve(args.port))


if __name__ == "__main__":
    main()
