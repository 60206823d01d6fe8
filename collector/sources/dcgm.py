"""NVIDIA's DCGM exporter as a scrape target (`kind: dcgm`): GPU memory, activity and power per
GPU, for the cost model's busy/idle split and the GPU memory alert
(shared/reference/gpu-capacity-cost.md section 1).

Each GPU is a "model" of the target (`gpu0`, or `gpu0/3` for MIG instance 3) with these gauges:

    gpu_memory_used_mib, gpu_memory_free_mib, gpu_memory_reserved_mib   DCGM_FI_DEV_FB_*
    gpu_memory_used_ratio     used / (used + free + reserved)   (FB_TOTAL is not in the default set)
    gpu_util_percent          DCGM_FI_DEV_GPU_UTIL (coarse: one kernel on one SM reads 100 %)
    gpu_engine_active         DCGM_FI_PROF_GR_ENGINE_ACTIVE (0-1; profiling GPUs only)
    gpu_power_watts           DCGM_FI_DEV_POWER_USAGE

A missing series is "not exposed" (profiling fields need a datacenter GPU), never 0, and DCGM's
"not supported" sentinels are dropped. Types come from each scrape's `# TYPE`; a family declared
anything but a gauge is refused with its name, as vLLM's are.
"""

from __future__ import annotations

import math

from prometheus_client.parser import text_string_to_metric_families

from collector.sources.expfmt import ExpositionError, decode_body
from collector.sources.vllm import EngineSnapshot, SeriesKey

GPU_PREFIX = "gpu_"  # every DCGM-derived metric: kept out of the serving view and the SLOs
FIELDS = {
    "DCGM_FI_DEV_FB_USED": "gpu_memory_used_mib",
    "DCGM_FI_DEV_FB_FREE": "gpu_memory_free_mib",
    "DCGM_FI_DEV_FB_RESERVED": "gpu_memory_reserved_mib",
    "DCGM_FI_DEV_GPU_UTIL": "gpu_util_percent",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "gpu_engine_active",
    "DCGM_FI_DEV_POWER_USAGE": "gpu_power_watts",
}
USED_RATIO = "gpu_memory_used_ratio"
ENGINE_ACTIVE = "gpu_engine_active"
INT64_BLANK = 9223372036854775792.0  # DCGM_INT64_BLANK and the sentinels above it
FP64_BLANK = 140737488355328.0  # DCGM_FP64_BLANK


def is_gpu_metric(metric: str) -> bool:
    return metric.startswith(GPU_PREFIX)


def read_dcgm(body: bytes | str, sample_limit: int = 0) -> EngineSnapshot:
    """Parse one DCGM exporter scrape. Raises ExpositionError naming what is wrong."""
    text = decode_body(body) if isinstance(body, bytes) else body
    snapshot = EngineSnapshot()
    samples = 0
    try:
        families = list(text_string_to_metric_families(text))
    except (ValueError, TypeError, IndexError) as exc:
        raise ExpositionError("parse", f"not Prometheus text exposition: {exc}") from None
    for family in families:
        metric = FIELDS.get(family.name)
        if metric is None:
            continue
        if family.type not in ("gauge", "untyped", "unknown"):
            raise ExpositionError("parse", f"{family.name} is declared {family.type}, expected gauge")
        for s in family.samples:
            samples += 1
            if sample_limit and samples > sample_limit:
                raise ExpositionError(
                    "sample_limit", f"more than scrape.sample_limit {sample_limit} DCGM samples; nothing stored"
                )
            value = float(s.value)
            if not math.isfinite(value) or value < 0 or value >= FP64_BLANK or value >= INT64_BLANK:
                continue  # "not supported" / blank
            gpu = s.labels.get("gpu", "")
            instance = s.labels.get("GPU_I_ID")
            name = f"gpu{gpu}" + (f"/{instance}" if instance else "")
            snapshot.gauges[SeriesKey(name, metric)] = value
    for key in [k for k in snapshot.gauges if k.metric == "gpu_memory_used_mib"]:
        used = snapshot.gauges[key]
        free = snapshot.gauges.get(SeriesKey(key.model, "gpu_memory_free_mib"))
        reserved = snapshot.gauges.get(SeriesKey(key.model, "gpu_memory_reserved_mib"), 0.0)
        if free is not None and used + free + reserved > 0:
            snapshot.gauges[SeriesKey(key.model, USED_RATIO)] = used / (used + free + reserved)
    snapshot.samples = samples
    return snapshot
