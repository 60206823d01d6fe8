"""A DCGM-exporter-compatible /metrics for a simulated replica's GPU (the 4.x default counters
llmslo reads, with the exporter's labels), so the cost model's GPU path is tested without a GPU.

vLLM reserves `gpu_memory_utilization` of the GPU's memory at start-up whatever the load, plus the
CUDA context: FB_USED sits flat there (the reason llmslo never reads it as load). The graphics
engine is active while requests run, more with a bigger batch. A `gpu_memory_pressure` incident
is another process taking memory: FB_USED climbs to `factor` of the total.
"""

from __future__ import annotations

from collector.sim.model import Fleet, Replica

CUDA_CONTEXT_MIB = 500.0
GIB_MIB = 1024.0


def engine_active(running: int) -> float:
    return 0.0 if running <= 0 else min(1.0, 0.3 + 0.05 * running)


def render_dcgm(fleet: Fleet, rep: Replica, t: float) -> str:
    dep = rep.deployment
    total = dep.gpu_memory_gb * GIB_MIB
    used = min(total, total * dep.gpu_memory_utilization + CUDA_CONTEXT_MIB)
    pressure = fleet._effect("gpu_memory_pressure", rep, t)
    if pressure is not None:
        used = max(used, min(total, total * pressure.factor))
    running = len(rep.running) if rep.up else 0
    active = engine_active(running)
    labels = (
        f'gpu="0",UUID="GPU-sim-{rep.name}",pci_bus_id="00000000:00:07.0",device="nvidia0",'
        f'modelName="NVIDIA L4",Hostname="{rep.name}",DCGM_FI_DRIVER_VERSION="595.58.03",'
        f'container="vllm",namespace="llm",pod="{rep.name}"'
    )
    rows = [
        ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", f"{100 if running else 0}"),
        ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", f"{total - used:.0f}"),
        ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", f"{used:.0f}"),
        ("DCGM_FI_DEV_FB_RESERVED", "Framebuffer memory reserved (in MiB).", "0"),
        ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", f"{30 + 40 * active:.3f}"),
        ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "Ratio of time the graphics engine is active.", f"{active:.6f}"),
        # a field this GPU does not support: the exporter leaks DCGM's sentinel
        ("DCGM_FI_DEV_MEMORY_TEMP", "Memory temperature (in C).", "9223372036854775794"),
    ]
    out = []
    for name, help_text, value in rows:
        out.append(f"# HELP {name} {help_text}\n# TYPE {name} gauge\n{name}{{{labels}}} {value}\n")
    out.append(
        "# HELP DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION Total energy consumption since boot (in mJ).\n"
        "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter\n"
        f"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{{labels}}} {int(t * 50_000)}\n"
    )
    return "".join(out)
