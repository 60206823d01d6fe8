"""The simulated fleet: workload, vLLM-like replicas and incidents, as an event-driven model.

Time is a float of seconds since the scenario start; the same code runs against the wall clock
(real-time mode) and against a virtual clock (fast mode). Per request: TTFT = queue wait +
uncached prompt tokens / prefill throughput; decode time per token grows with the running batch;
KV-cache capacity from the seed's formula (2 x layers x kv_heads x head_dim x bytes per token)
limits concurrency next to max_num_seqs, hence queueing and preemption; prefix-cache hits come
from system prompts shared by the requests of a business type.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from collector.sim.exposition import EngineMetrics


@dataclass(frozen=True, slots=True)
class ModelSpec:
    name: str
    params_billion: float
    layers: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int = 2

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes

    @property
    def weight_bytes(self) -> float:
        return self.params_billion * 1e9 * self.dtype_bytes


@dataclass(frozen=True, slots=True)
class DeploymentSpec:
    name: str
    model: ModelSpec
    gpu_memory_gb: float
    replicas: int
    business_types: tuple[str, ...]
    gpu_memory_utilization: float = 0.9
    max_num_seqs: int = 64
    max_model_len: int = 8192
    block_size: int = 16
    prefill_tokens_per_second: float = 8000.0
    decode_seconds_per_token: float = 0.012
    decode_batch_slope: float = 0.02  # decode step time grows by this fraction per running request
    traffic_share: float | None = None  # a canary's share of its business types' requests

    @property
    def kv_capacity_tokens(self) -> int:
        free = self.gpu_memory_gb * 1e9 * self.gpu_memory_utilization - self.model.weight_bytes
        return max(0, int(free // self.model.kv_bytes_per_token))


@dataclass(frozen=True, slots=True)
class BusinessProfile:
    name: str
    share: float
    prompt_tokens_median: float
    prompt_tokens_sigma: float
    output_tokens_median: float
    output_tokens_sigma: float
    max_tokens: int
    system_prompt_tokens: int
    system_prompts: int
    tenants: tuple[str, ...] = ("default",)
    streaming_share: float = 0.8


@dataclass(frozen=True, slots=True)
class Incident:
    kind: str
    start: float
    duration: float
    target: str | None = None  # replica name (e.g. "chat-0") or deployment name; None = all
    factor: float = 1.0
    error_ratio: float = 0.0
    delay_seconds: float = 0.0

    def active(self, t: float) -> bool:
        return self.start <= t < self.start + self.duration

    def hits(self, replica: str, deployment: str) -> bool:
        return self.target is None or self.target in (replica, deployment)


@dataclass(slots=True)
class Request:
    id: int
    business_type: str
    tenant: str
    arrival: float
    prompt_tokens: int
    system_tokens: int
    system_prompt: int
    output_tokens: int
    max_tokens: int
    stream: bool
    replica: str = ""
    model: str = ""
    admitted: float = math.nan
    first_token: float = math.nan
    finished: float = math.nan
    cached_tokens: int = 0
    tpot: float = 0.0
    reason: str = ""
    error_type: str = ""  # set when the gateway saw a failure (refused, engine error)
    preemptions: int = 0
    version: int = 0  # invalidates stale finish events after a preemption

    @property
    def done(self) -> bool:
        return not math.isnan(self.finished)

    @property
    def ttft(self) -> float:
        return self.first_token - self.arrival

    @property
    def e2e(self) -> float:
        return self.finished - self.arrival

    @property
    def kv_tokens(self) -> int:
        return self.prompt_tokens + self.output_tokens


@dataclass
class Replica:
    """One vLLM server: a waiting queue, a running batch, KV capacity, and its metrics."""

    name: str
    deployment: DeploymentSpec
    metrics: EngineMetrics
    up: bool = True
    waiting: list[Request] = field(default_factory=list)
    running: dict[int, Request] = field(default_factory=dict)
    kv_used: int = 0
    cache_last_used: dict[tuple[str, int], float] = field(default_factory=dict)

    @property
    def kv_capacity(self) -> int:
        return max(1, self.deployment.kv_capacity_tokens)

    def refresh_gauges(self) -> None:
        self.metrics.running = len(self.running)
        self.metrics.waiting = len(self.waiting)
        self.metrics.kv_usage = min(1.0, self.kv_used / self.kv_capacity)


class Fleet:
    """All replicas of all deployments, the workload that drives them, and the incidents."""

    def __init__(
        self,
        deployments: list[DeploymentSpec],
        profiles: list[BusinessProfile],
        incidents: list[Incident],
        base_rate: float,
        daily_amplitude: float = 0.5,
        start_hour: float = 10.0,
        seed: int = 1,
        start_unix: float = 0.0,
        prefix_cache_ttl: float = 600.0,
    ) -> None:
        self.deployments = deployments
        self.profiles = profiles
        self.incidents = incidents
        self.base_rate = base_rate
        self.daily_amplitude = daily_amplitude
        self.start_hour = start_hour
        self.start_unix = start_unix
        self.prefix_cache_ttl = prefix_cache_ttl
        self.rng = random.Random(seed)
        self.now = 0.0
        self.ids = itertools.count(1)
        self.events: list[tuple[float, int, int, str, int]] = []  # (time, seq, request id, kind, version)
        self.seq = itertools.count()
        self.requests: dict[int, Request] = {}
        self.on_finish: list[Callable[[Request], None]] = []
        self.replicas: dict[str, Replica] = {}
        self.by_business: dict[str, list[Replica]] = {}
        for dep in deployments:
            for i in range(dep.replicas):
                name = f"{dep.name}-{i}"
                rep = Replica(name, dep, EngineMetrics(dep.max_model_len, start_unix))
                self.replicas[name] = rep
                for bt in dep.business_types:
                    self.by_business.setdefault(bt, []).append(rep)
        total = sum(p.share for p in profiles) or 1.0
        self.mix = [(p, p.share / total) for p in profiles]
        self.next_arrival = self._draw_next_arrival(0.0)
        self.restarted: set[tuple[str, float]] = set()

    # --- workload ----------------------------------------------------------------------------

    def rate_at(self, t: float) -> float:
        """Arrivals per second: a daily sine profile (peak at 14:00) times any overload factor."""
        hour = (self.start_hour + t / 3600.0) % 24.0
        profile = 1.0 + self.daily_amplitude * math.cos((hour - 14.0) / 24.0 * 2 * math.pi)
        factor = 1.0
        for inc in self.incidents:
            if inc.kind == "overload" and inc.active(t):
                factor *= inc.factor
        return self.base_rate * profile * factor

    def _peak_rate(self) -> float:
        overload = max([i.factor for i in self.incidents if i.kind == "overload"] + [1.0])
        return self.base_rate * (1.0 + abs(self.daily_amplitude)) * overload

    def _draw_next_arrival(self, t: float) -> float:
        """Non-homogeneous Poisson arrivals by thinning against the peak rate."""
        peak = self._peak_rate()
        if peak <= 0:
            return math.inf
        while True:
            t += self.rng.expovariate(peak)
            if self.rng.random() * peak <= self.rate_at(t):
                return t

    def _new_request(self, t: float) -> Request:
        x, acc = self.rng.random(), 0.0
        profile = self.mix[-1][0]
        for p, share in self.mix:
            acc += share
            if x < acc:
                profile = p
                break
        drift = 1.0
        for inc in self.incidents:
            if inc.kind == "prompt_drift" and inc.active(t) and (inc.target in (None, profile.name)):
                drift *= inc.factor
        user = max(
            1,
            int(self.rng.lognormvariate(math.log(profile.prompt_tokens_median), profile.prompt_tokens_sigma) * drift),
        )
        out = max(
            1,
            int(self.rng.lognormvariate(math.log(profile.output_tokens_median), profile.output_tokens_sigma)),
        )
        out = min(out, profile.max_tokens)
        return Request(
            id=next(self.ids),
            business_type=profile.name,
            tenant=self.rng.choice(profile.tenants),
            arrival=t,
            prompt_tokens=profile.system_prompt_tokens + user,
            system_tokens=profile.system_prompt_tokens,
            system_prompt=self.rng.randrange(max(1, profile.system_prompts)),
            output_tokens=out,
            max_tokens=profile.max_tokens,
            stream=self.rng.random() < profile.streaming_share,
        )

    # --- incidents ---------------------------------------------------------------------------

    def _effect(self, kind: str, rep: Replica, t: float) -> Incident | None:
        for inc in self.incidents:
            if inc.kind == kind and inc.active(t) and inc.hits(rep.name, rep.deployment.name):
                return inc
        return None

    def replica_available(self, rep: Replica, t: float) -> bool:
        return self._effect("replica_down", rep, t) is None and self._effect("server_restart", rep, t) is None

    def metrics_fault(self, replica: str, t: float) -> Incident | None:
        """A slow_metrics or malformed_metrics incident that applies to this replica's /metrics."""
        rep = self.replicas[replica]
        return self._effect("slow_metrics", rep, t) or self._effect("malformed_metrics", rep, t)

    def _apply_restarts(self, t: float) -> None:
        for inc in self.incidents:
            if inc.kind != "server_restart" or inc.start > t:
                continue
            for rep in self.replicas.values():
                key = (rep.name, inc.start)
                if inc.hits(rep.name, rep.deployment.name) and key not in self.restarted:
                    self.restarted.add(key)
                    self._restart(rep, inc.start)

    def _restart(self, rep: Replica, t: float) -> None:
        """The process dies: in-flight requests fail at the gateway, every counter starts again."""
        for req in [*rep.waiting, *rep.running.values()]:
            req.version += 1
            self._fail(req, t, "connection_reset")
        rep.waiting.clear()
        rep.running.clear()
        rep.kv_used = 0
        rep.cache_last_used.clear()
        rep.metrics = EngineMetrics(rep.deployment.max_model_len, self.start_unix + t)

    # --- the engine --------------------------------------------------------------------------

    def submit(self, req: Request, t: float, replica: str | None = None) -> None:
        """A request reaches the gateway at `t`; it is routed to the least-loaded available replica."""
        self.requests[req.id] = req
        candidates = [self.replicas[replica]] if replica else self.by_business.get(req.business_type, [])
        canary = [r for r in candidates if r.deployment.traffic_share is not None]
        if canary and len(canary) < len(candidates):  # a canary's share, the rest to the others
            chosen = self.rng.random() < (canary[0].deployment.traffic_share or 0.0)
            candidates = canary if chosen else [r for r in candidates if r.deployment.traffic_share is None]
        live = [r for r in candidates if self.replica_available(r, t)]
        if not live:
            self._fail(req, t, "connection_refused")
            return
        rep = min(live, key=lambda r: (len(r.running) + len(r.waiting), r.name))
        req.replica, req.model = rep.name, rep.deployment.model.name
        if req.kv_tokens > rep.deployment.max_model_len:
            req.output_tokens = max(1, rep.deployment.max_model_len - req.prompt_tokens)
        rep.waiting.append(req)
        self._admit(rep, t)

    def _fail(self, req: Request, t: float, error_type: str) -> None:
        req.error_type = error_type
        req.reason = "error"
        req.finished = t
        if math.isnan(req.first_token):
            req.first_token = t
        for cb in self.on_finish:
            cb(req)

    def _admit(self, rep: Replica, t: float) -> None:
        dep = rep.deployment
        slow = self._effect("latency_regression", rep, t)
        slow_factor = slow.factor if slow else 1.0
        collapse = self._effect("prefix_cache_collapse", rep, t) is not None
        while rep.waiting:
            req = rep.waiting[0]
            if len(rep.running) >= dep.max_num_seqs:
                break
            if rep.kv_used + req.kv_tokens > rep.kv_capacity:
                if rep.running and rep.kv_used > 0.95 * rep.kv_capacity:
                    self._preempt(rep, t)
                break
            rep.waiting.pop(0)
            key = (req.business_type, req.system_prompt)
            last = rep.cache_last_used.get(key)
            hit = not collapse and last is not None and t - last <= self.prefix_cache_ttl
            cached = (req.system_tokens // dep.block_size) * dep.block_size if hit else 0
            rep.cache_last_used[key] = t
            if math.isnan(req.admitted):  # vLLM counts prompt tokens when it prefills them
                rep.metrics.prompt_tokens += req.prompt_tokens
                rep.metrics.prefix_queries += req.prompt_tokens
                rep.metrics.prefix_hits += cached
                req.cached_tokens = cached
                req.admitted = t
            prefill = (req.prompt_tokens - req.cached_tokens) / dep.prefill_tokens_per_second * slow_factor
            batch = len(rep.running) + 1
            req.tpot = dep.decode_seconds_per_token * (1 + dep.decode_batch_slope * batch) * slow_factor
            if math.isnan(req.first_token):
                req.first_token = t + prefill
            start_decode = max(req.first_token, t + prefill)
            finish = start_decode + (req.output_tokens - 1) * req.tpot
            rep.running[req.id] = req
            rep.kv_used += req.kv_tokens
            heapq.heappush(self.events, (finish, next(self.seq), req.id, "finish", req.version))
        rep.refresh_gauges()

    def _preempt(self, rep: Replica, t: float) -> None:
        """KV is full and requests wait: vLLM preempts the most recently admitted request; it
        is recomputed later (its TTFT already happened, its decode finishes later)."""
        victim = max(rep.running.values(), key=lambda r: (r.admitted, r.id))
        del rep.running[victim.id]
        rep.kv_used -= victim.kv_tokens
        victim.version += 1
        victim.preemptions += 1
        rep.metrics.preemptions += 1
        rep.waiting.insert(1, victim)

    def _finish(self, req: Request, t: float) -> None:
        rep = self.replicas[req.replica]
        rep.running.pop(req.id, None)
        rep.kv_used -= req.kv_tokens
        req.finished = t
        errors = self._effect("error_burst", rep, req.admitted)
        if errors is not None and self.rng.random() < errors.error_ratio:
            req.reason, req.error_type = "error", "engine_error"
        else:
            req.reason = "length" if req.output_tokens >= req.max_tokens else "stop"
        queue = req.admitted - req.arrival
        prefill = req.first_token - req.admitted
        rep.metrics.record_finished(
            reason=req.reason,
            prompt_tokens=req.prompt_tokens,
            output_tokens=req.output_tokens,
            max_tokens=req.max_tokens,
            computed_prompt_tokens=req.prompt_tokens - req.cached_tokens,
            ttft=req.ttft,
            queue=queue,
            prefill=prefill,
            decode=t - req.first_token,
            e2e=req.e2e,
        )
        for cb in self.on_finish:
            cb(req)
        self._admit(rep, t)

    def advance(self, until: float) -> None:
        """Run every arrival and engine event up to `until` (seconds since the start)."""
        while True:
            next_event = self.events[0][0] if self.events else math.inf
            t = min(next_event, self.next_arrival)
            if t > until:
                break
            self._apply_restarts(t)
            if self.next_arrival <= next_event:
                self.submit(self._new_request(t), t)
                self.next_arrival = self._draw_next_arrival(t)
            else:
                _, _, rid, _, version = heapq.heappop(self.events)
                req = self.requests.get(rid)
                if req is not None and req.version == version and not req.done:
                    self._finish(req, t)
        self._apply_restarts(until)
        self.now = until
        for rep in self.replicas.values():
            rep.refresh_gauges()
        self._forget_done()

    def _forget_done(self) -> None:
        if len(self.requests) > 50_000:
            self.requests = {k: r for k, r in self.requests.items() if not r.done}
