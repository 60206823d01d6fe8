"""vLLM's default histogram bucket bounds (vllm/v1/metrics/buckets.py, 0.33.0; V0 before 0.8).

The collector never relies on these (bounds are read from every scrape); they are used where
no scrape is at hand: the simulator's exposition and the rules check that warns when an SLO
threshold falls between two bounds.
"""

from __future__ import annotations

# fmt: off
TTFT = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
        20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
INTER_TOKEN_LATENCY = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                       10.0, 20.0, 40.0, 80.0)
REQUEST_LATENCY = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                   240.0, 480.0, 960.0, 1920.0, 7680.0)
ITERATION_TOKENS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
PARAMS_N = (1, 2, 5, 10, 20)
# fmt: on
V0_TTFT = TTFT[:16]
V0_INTER_TOKEN_LATENCY = INTER_TOKEN_LATENCY[:13]
V0_REQUEST_LATENCY = REQUEST_LATENCY[:15]

# logical latency metric -> (vLLM histogram family, default bounds)
LATENCY_HISTOGRAMS: dict[str, tuple[str, tuple[float, ...]]] = {
    "ttft": ("vllm:time_to_first_token_seconds", TTFT),
    "tpot": ("vllm:request_time_per_output_token_seconds", INTER_TOKEN_LATENCY),
    "itl": ("vllm:inter_token_latency_seconds", INTER_TOKEN_LATENCY),
    "e2e": ("vllm:e2e_request_latency_seconds", REQUEST_LATENCY),
    "queue": ("vllm:request_queue_time_seconds", REQUEST_LATENCY),
}


def request_token_buckets(max_model_len: int) -> tuple[float, ...]:
    """vLLM's 1-2-5 series capped at max_model_len."""
    out: list[float] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_model_len:
                return tuple(out)
            out.append(float(value))
        exponent += 1
