"""The memory alert ("memory usage > 95 %", seeds): GPU framebuffer from the deployment's DCGM
exporters when they answer, vLLM's KV-cache usage otherwise; fired through llmslo's evaluator
after `kv_cache_for`, resolved when the pressure goes."""

from __future__ import annotations

from pathlib import Path

from collector.config import Settings
from collector.runtime import Runtime
from collector.sim.exposition import EngineMetrics, render

ROOT = Path(__file__).resolve().parents[2]
TOTAL_MIB = 24 * 1024


def dcgm(used_ratio: float) -> str:
    used = TOTAL_MIB * used_ratio
    return (
        "# TYPE DCGM_FI_DEV_FB_USED gauge\n"
        f'DCGM_FI_DEV_FB_USED{{gpu="0",UUID="GPU-x",modelName="NVIDIA L4"}} {used:.0f}\n'
        "# TYPE DCGM_FI_DEV_FB_FREE gauge\n"
        f'DCGM_FI_DEV_FB_FREE{{gpu="0",UUID="GPU-x",modelName="NVIDIA L4"}} {TOTAL_MIB - used:.0f}\n'
    )


def firing(rt: Runtime) -> dict[tuple[str, str], dict[str, str]]:
    return {
        (a.labels["alertname"], a.labels.get("source", "")): a.annotations
        for a in rt.alerts.instances.values()
        if a.state != "resolved" and a.labels["alertname"] == "LLMSLOMemoryNearlyFull"
    }


def test_dcgm_first_kv_cache_otherwise(tmp_path: Path) -> None:
    settings = Settings.model_validate(
        {
            "data_dir": str(tmp_path),
            "rules": str(ROOT / "rules"),
            "scrape": {"interval": "15s"},
            "targets": [
                {"name": "vllm-0", "url": "http://127.0.0.1:1/metrics", "business_type": "chat"},
                {"name": "vllm-0-dcgm", "url": "http://127.0.0.1:1/dcgm", "kind": "dcgm"},
            ],
            "deployments": [
                {"name": "pool", "targets": ["vllm-0", "vllm-0-dcgm"], "gpu": "L4", "gpu_hour_usd": 0.8,
                 "gpu_memory_utilization": 0.9}
            ],
        }
    )  # fmt: skip
    rt = Runtime(settings)
    engine = EngineMetrics(max_model_len=8192, created_unix=900.0)
    t0 = 1_800_000_000.0
    engine.created_unix = t0 - 60

    def scrape(now: float, used_ratio: float | None, kv: float) -> None:
        engine.kv_usage = kv
        rt.scrapers["vllm-0"].ingest(render("current", "m", engine), "text/plain", now)
        if used_ratio is not None:
            rt.scrapers["vllm-0-dcgm"].ingest(dcgm(used_ratio), "text/plain", now)

    # vLLM's own reservation (0.9 + context): normal, whatever the KV cache says
    now = t0
    for _ in range(25):
        scrape(now, 0.93, 0.97)
        rt.evaluate_slos(now)
        now += 15
    [reading] = rt.memory_readings(now - 15)
    assert (reading.source, reading.threshold) == ("dcgm", 0.95)
    assert firing(rt) == {}
    # another process takes memory: above 0.95 for kv_cache_for (5 min) -> a ticket
    for _ in range(20):  # 0 .. 285 s: not yet
        scrape(now, 0.985, 0.2)
        rt.evaluate_slos(now)
        now += 15
    assert firing(rt) == {}
    scrape(now, 0.985, 0.2)
    rt.evaluate_slos(now)  # 300 s
    fired = firing(rt)
    assert set(fired) == {("LLMSLOMemoryNearlyFull", "dcgm")}
    assert "vllm-0-dcgm gpu0" in fired[("LLMSLOMemoryNearlyFull", "dcgm")]["description"]
    scrape(now, 0.93, 0.2)
    rt.evaluate_slos(now)
    assert firing(rt) == {}  # resolved with the pressure
    # no DCGM answer (exporter gone stale): the KV cache stands in, at the KV threshold
    for _ in range(25):  # stale after 2 intervals + 5 s, then 5 minutes above 0.95
        now += 15
        scrape(now, None, 0.97)
        rt.evaluate_slos(now)
    [reading] = rt.memory_readings(now)
    assert (reading.source, reading.threshold) == ("kv_cache", 0.95)
    assert set(firing(rt)) == {("LLMSLOMemoryNearlyFull", "kv_cache")}
    rt.store.close()
