"""Real-time mode: every simulated replica is an HTTP server on its own loopback port, serving
vLLM's /metrics and an OpenAI-compatible API whose answers keep the simulated timing.

A replica that is down (replica_down, or during a server_restart) has its server stopped, so
clients and scrapers get a refused connection, as from a dead process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import uvicorn
from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from collector.api.embedded import EmbeddedServer
from collector.sim import model as m
from collector.sim.dcgm import render_dcgm
from collector.sim.exposition import render
from collector.sim.scenario import Scenario
from collector.sim.spans import SpanEmitter

log = logging.getLogger(__name__)
TICK_SECONDS = 0.05
WORDS = tuple("the model answers with plain words so that clients can count tokens in the stream".split())


@dataclass
class ReplicaServer:
    name: str
    port: int
    server: EmbeddedServer | None = None
    task: asyncio.Task[None] | None = None


class Simulation:
    """The fleet against the wall clock, plus one HTTP server per replica."""

    def __init__(
        self,
        scenario: Scenario,
        vllm_version: str | None = None,
        host: str = "127.0.0.1",
        base_port: int = 0,
        builtin_workload: bool = True,
        emitter: SpanEmitter | None = None,
    ) -> None:
        self.scenario = scenario
        self.version = vllm_version or scenario.spec.vllm_version
        self.host = host
        self.fleet = scenario.fleet()
        if not builtin_workload:
            self.fleet.base_rate = 0.0
            self.fleet.next_arrival = float("inf")
        self.started_wall = time.time()
        self.fleet.start_unix = self.started_wall  # real-time: the scenario starts now
        for rep in self.fleet.replicas.values():
            rep.metrics.created_unix = self.started_wall
        self.emitter = emitter
        if emitter is not None:
            emitter.start_unix = self.started_wall
            self.fleet.on_finish.append(emitter.emit)
        self.replicas = {
            name: ReplicaServer(name, base_port + i if base_port else 0)
            for i, name in enumerate(scenario.replica_names)
        }
        self.done: list[m.Request] = []
        self.fleet.on_finish.append(self._finished)

    def _finished(self, req: m.Request) -> None:
        self.done.append(req)
        if len(self.done) > 100_000:
            del self.done[:50_000]

    @property
    def now(self) -> float:
        return time.time() - self.started_wall

    def url(self, replica: str, path: str = "/metrics") -> str:
        return f"http://{self.host}:{self.replicas[replica].port}{path}"

    async def start(self) -> None:
        for name in self.replicas:
            await self._start_server(name)
        self._ticker = asyncio.create_task(self._tick())

    async def stop(self) -> None:
        self._ticker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._ticker  # it may have been stopping or starting a replica
        for rs in self.replicas.values():
            await self._stop_server(rs)
        if self.emitter is not None:
            self.emitter.flush()

    async def _tick(self) -> None:
        while True:
            t = self.now
            self.fleet.advance(t)
            for name, rs in self.replicas.items():
                available = self.fleet.replica_available(self.fleet.replicas[name], t)
                if available and rs.server is None:
                    await self._start_server(name)
                elif not available and rs.server is not None:
                    await self._stop_server(rs)
            await asyncio.sleep(TICK_SECONDS)

    async def _start_server(self, name: str) -> None:
        rs = self.replicas[name]
        config = uvicorn.Config(
            self._app(name),
            host=self.host,
            port=rs.port,
            log_level="warning",
            access_log=False,
            lifespan="off",
        )
        server = EmbeddedServer(config)
        rs.server = server
        rs.task = asyncio.create_task(server.serve())
        while not server.started:
            if rs.task.done():
                rs.task.result()
            await asyncio.sleep(0.01)
        if rs.port == 0:
            rs.port = server.servers[0].sockets[0].getsockname()[1]

    async def _stop_server(self, rs: ReplicaServer) -> None:
        if rs.server is None:
            return
        rs.server.should_exit = True
        if rs.task is not None:
            # asyncio.wait, not `await task`: cancelling the caller must not cancel the server mid-exit
            await asyncio.wait([rs.task])
        rs.server, rs.task = None, None

    # --- the per-replica HTTP API ------------------------------------------------------------

    def _app(self, name: str) -> FastAPI:
        app = FastAPI(title=f"simulated vLLM {name}", docs_url=None, redoc_url=None, openapi_url=None)
        rep = self.fleet.replicas[name]

        @app.get("/metrics")
        async def metrics() -> Response:
            fault = self.fleet.metrics_fault(name, self.now)
            if fault is not None and fault.kind == "slow_metrics":
                await asyncio.sleep(fault.delay_seconds)
            if fault is not None and fault.kind == "malformed_metrics":
                body = 'vllm:num_requests_running{model_name="broken" 1\n\x00garbage\n'
            else:
                self.fleet.advance(self.now)
                body = render(
                    self.version,
                    rep.deployment.model.name,
                    rep.metrics,
                    rep.deployment.block_size,
                    rep.kv_capacity // rep.deployment.block_size,
                )
            return PlainTextResponse(body, media_type="text/plain; version=0.0.4; charset=utf-8")

        @app.get("/dcgm/metrics")
        async def dcgm_metrics() -> Response:
            """What NVIDIA's DCGM exporter beside this replica would serve for its GPU."""
            self.fleet.advance(self.now)
            return PlainTextResponse(render_dcgm(self.fleet, rep, self.now), media_type="text/plain; version=0.0.4")

        @app.get("/health")
        async def health() -> dict[str, str]:
            return {}

        @app.get("/v1/models")
        async def models() -> dict[str, Any]:
            return {
                "object": "list",
                "data": [
                    {
                        "id": rep.deployment.model.name,
                        "object": "model",
                        "owned_by": "llmslo-sim",
                        "max_model_len": rep.deployment.max_model_len,
                    }
                ],
            }

        @app.post("/v1/completions")
        async def completions(request: Request) -> Response:
            body = await request.json()
            prompt = body.get("prompt", "")
            text = prompt if isinstance(prompt, str) else " ".join(map(str, prompt))
            return await self._serve(name, request, body, text, chat=False)

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> Response:
            body = await request.json()
            messages = body.get("messages") or []
            text = " ".join(str(msg.get("content", "")) for msg in messages if isinstance(msg, dict))
            return await self._serve(name, request, body, text, chat=True)

        return app

    async def _serve(self, name: str, http: Request, body: dict[str, Any], text: str, chat: bool) -> Response:
        rep = self.fleet.replicas[name]
        model_name = rep.deployment.model.name
        if body.get("model") not in (None, model_name):
            raise HTTPException(404, f"The model `{body.get('model')}` does not exist.")
        max_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 256)
        prompt_tokens = max(1, int(len(text.split()) * 1.3))
        if prompt_tokens + max_tokens > rep.deployment.max_model_len:
            return JSONResponse(
                {
                    "error": {
                        "message": f"max_tokens={max_tokens} plus the prompt exceeds "
                        f"max_model_len={rep.deployment.max_model_len}",
                        "type": "BadRequestError",
                        "code": 400,
                    }
                },
                status_code=400,
            )
        business = http.headers.get("x-llmslo-business-type") or rep.deployment.business_types[0]
        profile = next((p for p in self.fleet.profiles if p.name == business), self.fleet.profiles[0])
        sampled = self.fleet.rng.lognormvariate(math.log(profile.output_tokens_median), profile.output_tokens_sigma)
        out = max(1, min(max_tokens, int(sampled)))
        if body.get("ignore_eos"):
            out = max_tokens
        now = self.now
        req = m.Request(
            id=next(self.fleet.ids),
            business_type=business,
            tenant=http.headers.get("x-llmslo-tenant", "api"),
            arrival=now,
            prompt_tokens=prompt_tokens,
            system_tokens=0,
            system_prompt=0,
            output_tokens=out,
            max_tokens=max_tokens,
            stream=bool(body.get("stream")),
        )
        self.fleet.submit(req, now, replica=name)
        created = int(time.time())
        rid = f"cmpl-sim-{req.id}"
        if req.stream:
            return StreamingResponse(self._stream(req, rid, created, model_name, chat), media_type="text/event-stream")
        while not req.done:
            await asyncio.sleep(0.01)
            self.fleet.advance(self.now)
        if req.error_type:
            return JSONResponse(
                {
                    "error": {
                        "message": f"simulated failure: {req.error_type}",
                        "type": "InternalServerError",
                        "code": 500,
                    }
                },
                status_code=500,
            )
        content = " ".join(WORDS[i % len(WORDS)] for i in range(req.output_tokens))
        usage = {
            "prompt_tokens": req.prompt_tokens,
            "completion_tokens": req.output_tokens,
            "total_tokens": req.prompt_tokens + req.output_tokens,
            "prompt_tokens_details": {"cached_tokens": req.cached_tokens},
        }
        choice: dict[str, Any] = {"index": 0, "finish_reason": req.reason}
        if chat:
            choice["message"] = {"role": "assistant", "content": content}
        else:
            choice["text"] = content
        return JSONResponse(
            {
                "id": rid,
                "object": "chat.completion" if chat else "text_completion",
                "created": created,
                "model": model_name,
                "choices": [choice],
                "usage": usage,
            }
        )

    async def _stream(self, req: m.Request, rid: str, created: int, model: str, chat: bool) -> AsyncIterator[str]:
        """SSE chunks on the simulated clock: the first at TTFT, then one token every TPOT."""
        sent = 0
        obj = "chat.completion.chunk" if chat else "text_completion"
        while sent < req.output_tokens:
            self.fleet.advance(self.now)
            if req.error_type:
                yield f"data: {json.dumps({'error': {'message': req.error_type, 'code': 500}})}\n\n"
                break
            if math.isnan(req.first_token) or self.now < req.first_token:
                await asyncio.sleep(0.01)
                continue
            due = (
                req.output_tokens
                if req.done
                else min(req.output_tokens, 1 + int((self.now - req.first_token) / max(req.tpot, 1e-6)))
            )
            while sent < due:
                word = WORDS[sent % len(WORDS)] + " "
                delta = {"content": word} if chat else None
                choice: dict[str, Any] = {"index": 0, "finish_reason": None}
                if chat:
                    choice["delta"] = delta
                else:
                    choice["text"] = word
                sent += 1
                if sent == req.output_tokens:
                    while not req.done:
                        await asyncio.sleep(0.005)
                        self.fleet.advance(self.now)
                    choice["finish_reason"] = req.reason
                chunk = {"id": rid, "object": obj, "created": created, "model": model, "choices": [choice]}
                yield f"data: {json.dumps(chunk)}\n\n"
            await asyncio.sleep(min(0.05, max(req.tpot, 0.001)))
        yield "data: [DONE]\n\n"
