"""The seeds' cost and memory formulas, each a pure function tested against the seeds' worked
examples (tests/unit/test_cost_formulas.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from collector.cost.arch import ModelArch

GIB = 1024**3
MILLION = 1_000_000.0


@dataclass(frozen=True, slots=True)
class ApiPrices:
    """A managed API's list prices, USD per million tokens."""

    input: float
    output: float
    cached_input: float | None = None  # None: cached input billed as input

    def cost(self, uncached_input: float, cached_input: float, output: float) -> float:
        cached_price = self.input if self.cached_input is None else self.cached_input
        return (uncached_input * self.input + cached_input * cached_price + output * self.output) / MILLION


@dataclass(frozen=True, slots=True)
class CacheSavings:
    without_cache: float
    with_cache: float

    @property
    def saved(self) -> float:
        return self.without_cache - self.with_cache

    @property
    def saved_share(self) -> float:
        return self.saved / self.without_cache if self.without_cache > 0 else 0.0


def prompt_cache_savings(
    requests: float, cached_prompt_tokens_per_request: float, hit_rate: float, prices: ApiPrices
) -> CacheSavings:
    """The seeds' prompt-caching ROI: a shared prompt prefix billed at the input price on a miss
    and at the cached-input price on a hit."""
    tokens = requests * cached_prompt_tokens_per_request
    without = prices.cost(tokens, 0.0, 0.0)
    with_cache = prices.cost(tokens * (1.0 - hit_rate), tokens * hit_rate, 0.0)
    return CacheSavings(without, with_cache)


def break_even_requests(fixed_cost: float, api_cost_per_request: float) -> float | None:
    """Requests (in the period `fixed_cost` covers) above which self-hosting at `fixed_cost`
    is cheaper than the API; None when an API request costs nothing."""
    if api_cost_per_request <= 0:
        return None
    return fixed_cost / api_cost_per_request


@dataclass(frozen=True, slots=True)
class MemoryFit:
    """One replica's memory on its most loaded GPU (tensor parallel splits weights and KV heads)."""

    gpu_memory_bytes: float  # one GPU
    usable_bytes: float  # x gpu_memory_utilization
    weights_bytes: float | None  # per GPU
    kv_bytes: float  # per GPU, at `concurrency` sequences of `context_tokens`
    headroom: float  # the seeds' activation factor (1.1-1.3) on weights + KV
    concurrency: float
    context_tokens: float
    max_concurrency: int | None  # sequences of `context_tokens` that fit, None without weights

    @property
    def needed_bytes(self) -> float | None:
        if self.weights_bytes is None:
            return None
        return (self.weights_bytes + self.kv_bytes) * self.headroom

    @property
    def fits(self) -> bool | None:
        need = self.needed_bytes
        return None if need is None else need <= self.usable_bytes


def memory_fit(
    arch: ModelArch,
    gpu_memory_bytes: float,
    gpu_memory_utilization: float,
    tensor_parallel: int,
    concurrency: float,
    context_tokens: float,
    headroom: float = 1.2,
    bytes_per_parameter: float | None = None,
) -> MemoryFit:
    """weights + KV at `concurrency` x `context_tokens`, x headroom, against GPU memory x
    utilisation, per GPU of a `tensor_parallel`-way replica."""
    weights = arch.weight_bytes(bytes_per_parameter)
    per_gpu_weights = None if weights is None else weights / tensor_parallel
    kv_per_seq = arch.kv_bytes_per_sequence(context_tokens, tensor_parallel)
    usable = gpu_memory_bytes * gpu_memory_utilization
    max_conc: int | None = None
    if per_gpu_weights is not None and kv_per_seq > 0:
        max_conc = max(0, math.floor((usable / headroom - per_gpu_weights) / kv_per_seq))
    return MemoryFit(
        gpu_memory_bytes,
        usable,
        per_gpu_weights,
        kv_per_seq * concurrency,
        headroom,
        concurrency,
        context_tokens,
        max_conc,
    )


def remedies(fit: MemoryFit, arch: ModelArch, tensor_parallel: int) -> list[str]:
    """What to change when a replica does not fit (the seeds' levers), most direct first."""
    if fit.fits is not False or fit.weights_bytes is None:
        return []
    out: list[str] = []
    if fit.max_concurrency is not None and fit.max_concurrency > 0:
        out.append(f"cap concurrency at {fit.max_concurrency} sequences (--max-num-seqs) at this context")
    if arch.kv_dtype_bytes > 1:
        out.append("store the KV cache in fp8 (--kv-cache-dtype fp8): half the KV memory")
    if arch.dtype_bytes >= 2:
        out.append("quantise the weights (INT8 halves them, INT4 quarters them)")
    out.append(f"raise tensor parallelism above {tensor_parallel} (weights and KV heads split across more GPUs)")
    if fit.context_tokens > 0:
        out.append("lower --max-model-len if the long tail of contexts can be refused")
    return out
