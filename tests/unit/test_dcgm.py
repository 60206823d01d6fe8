"""DCGM exporter scrapes: the fields llmslo reads, MIG instances, DCGM's sentinels, the derived
framebuffer ratio, and what is refused."""

from __future__ import annotations

import pytest

from collector.sources.dcgm import read_dcgm
from collector.sources.expfmt import ExpositionError
from collector.sources.vllm import SeriesKey

# the exporter's 4.x labels (shared/reference/gpu-capacity-cost.md section 1.3), an L40S and a MIG slice
L40S = (
    'gpu="0",UUID="GPU-5b4e",pci_bus_id="00000000:00:07.0",device="nvidia0",modelName="NVIDIA L40S",'
    'Hostname="gpu1",DCGM_FI_DRIVER_VERSION="595.58.03",container="vllm",namespace="llm",pod="vllm-0"'
)
MIG = 'gpu="1",UUID="GPU-1f02",device="nvidia1",modelName="NVIDIA A800-SXM4-80GB",GPU_I_PROFILE="2g.20gb",GPU_I_ID="3"'
BODY = f"""\
# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB).
# TYPE DCGM_FI_DEV_FB_USED gauge
DCGM_FI_DEV_FB_USED{{{L40S}}} 41210
DCGM_FI_DEV_FB_USED{{{MIG}}} 100
# HELP DCGM_FI_DEV_FB_FREE Framebuffer memory free (in MiB).
# TYPE DCGM_FI_DEV_FB_FREE gauge
DCGM_FI_DEV_FB_FREE{{{L40S}}} 4249
# HELP DCGM_FI_DEV_FB_RESERVED Framebuffer memory reserved (in MiB).
# TYPE DCGM_FI_DEV_FB_RESERVED gauge
DCGM_FI_DEV_FB_RESERVED{{{L40S}}} 608
# HELP DCGM_FI_PROF_GR_ENGINE_ACTIVE Ratio of time the graphics engine is active.
# TYPE DCGM_FI_PROF_GR_ENGINE_ACTIVE gauge
DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{L40S}}} 0.731250
DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{MIG}}} 0.000000
# HELP DCGM_FI_DEV_MEMORY_TEMP Memory temperature (in C).
# TYPE DCGM_FI_DEV_MEMORY_TEMP gauge
DCGM_FI_DEV_MEMORY_TEMP{{gpu="0"}} 9223372036854775794
# HELP DCGM_FI_DEV_POWER_USAGE Power draw (in W).
# TYPE DCGM_FI_DEV_POWER_USAGE gauge
DCGM_FI_DEV_POWER_USAGE{{{L40S}}} 140737488355328.0
# HELP DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION Total energy consumption since boot (in mJ).
# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter
DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{gpu="0"}} 123456789
"""


def test_fields_mig_sentinels_and_the_framebuffer_ratio() -> None:
    snap = read_dcgm(BODY.encode())
    g = snap.gauges
    assert g[SeriesKey("gpu0", "gpu_memory_used_mib")] == 41210
    assert g[SeriesKey("gpu0", "gpu_memory_used_ratio")] == pytest.approx(41210 / (41210 + 4249 + 608))
    assert g[SeriesKey("gpu0", "gpu_engine_active")] == pytest.approx(0.73125)
    # a MIG instance is its own GPU; without FB_FREE no ratio is invented
    assert g[SeriesKey("gpu1/3", "gpu_memory_used_mib")] == 100
    assert SeriesKey("gpu1/3", "gpu_memory_used_ratio") not in g
    assert g[SeriesKey("gpu1/3", "gpu_engine_active")] == 0.0  # idle is 0, which is data
    # DCGM's "blank" sentinel for an unsupported field is dropped, not stored as a number
    assert SeriesKey("gpu0", "gpu_power_watts") not in g
    assert not snap.counters and not snap.histograms  # the energy counter is not read


def test_what_is_refused() -> None:
    with pytest.raises(ExpositionError, match="declared counter, expected gauge"):
        read_dcgm('# TYPE DCGM_FI_DEV_FB_USED counter\nDCGM_FI_DEV_FB_USED{gpu="0"} 5\n')
    with pytest.raises(ExpositionError) as err:
        read_dcgm('DCGM_FI_DEV_FB_USED{gpu="0" 5\n')
    assert err.value.reason == "parse"
    with pytest.raises(ExpositionError, match="sample_limit"):
        read_dcgm(BODY, sample_limit=3)
    with pytest.raises(ExpositionError):
        read_dcgm(b"\xff\xfe")
