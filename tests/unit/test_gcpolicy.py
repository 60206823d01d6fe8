"""collector/gcpolicy.py: the objects a derive pass leaves are frozen out of the cyclic
collector's walks, reference counting still frees them, and the hourly collection frees the
cycles that died while frozen (nothing is kept for good)."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest

from collector import gcpolicy, scheduler
from collector.config import Settings
from collector.runtime import Runtime


class Node:
    other: object = None


@pytest.fixture(autouse=True)
def thawed() -> Iterator[None]:
    """This test process must not keep anything frozen after the test."""
    yield
    gc.unfreeze()


def test_frozen_objects_are_freed_by_refcount_and_frozen_cycles_by_the_hourly_collection() -> None:
    cyclic, plain = Node(), Node()
    cyclic.other = cyclic
    cycle_alive, plain_alive = weakref.ref(cyclic), weakref.ref(plain)
    gcpolicy.freeze()
    assert gc.get_freeze_count() > 0
    del cyclic, plain
    assert plain_alive() is None  # reference counting frees a frozen object at once
    gc.collect()
    assert cycle_alive() is not None  # a cycle that died while frozen waits for the hourly pass
    freed = gcpolicy.collect_frozen()
    assert cycle_alive() is None and freed >= 1 and gc.get_freeze_count() == 0


def test_the_scheduler_freezes_after_each_derive_pass_and_collects_hourly(tmp_path: Path) -> None:
    rt = Runtime(Settings.model_validate({"data_dir": str(tmp_path)}))

    async def derive_once() -> int:
        await scheduler._derive(rt)
        return gc.get_freeze_count()

    assert asyncio.run(derive_once()) > 0
    jobs = {job.id: job for job in scheduler.build_scheduler(rt).get_jobs()}
    assert jobs["gc"].trigger.interval.total_seconds() == gcpolicy.COLLECT_FROZEN_SECONDS
    asyncio.run(scheduler._collect_frozen(rt))
    assert gc.get_freeze_count() == 0
    rt.store.close()


def test_serving_sets_the_switch_interval_and_thresholds_and_puts_the_interpreters_back(tmp_path: Path) -> None:
    import sys

    import httpx

    from collector.api.app import create_app
    from tests.embedded import free_port, serving

    before = (sys.getswitchinterval(), gc.get_threshold())
    port = free_port()
    settings = Settings.model_validate({"data_dir": str(tmp_path), "server": {"port": port, "switch_interval": "2ms"}})
    with serving(create_app(settings, schedule=False), port):
        assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=10).status_code == 200
        assert abs(sys.getswitchinterval() - 0.002) < 1e-9
        assert gc.get_threshold()[0] == 50_000
    assert (sys.getswitchinterval(), gc.get_threshold()) == before
    assert Settings.model_validate({"data_dir": str(tmp_path)}).server.switch_interval == 0.005


def test_a_pass_computes_with_the_pass_switch_interval_and_the_serving_one_comes_back(tmp_path: Path) -> None:
    """The derive, drift and SLO passes run their worker thread with `pass_switch_interval`;
    overlapping passes keep it until the last one ends, and a failing pass puts it back too."""
    import sys

    rt = Runtime(Settings.model_validate({"data_dir": str(tmp_path), "server": {"pass_switch_interval": "0.5ms"}}))
    serving_interval = sys.getswitchinterval()
    seen: list[float] = []

    def refresh(_now: float) -> None:
        seen.append(sys.getswitchinterval())

    def failing(_now: float) -> None:
        seen.append(sys.getswitchinterval())
        raise RuntimeError("the pass broke")

    rt.refresh_snapshot = refresh  # type: ignore[method-assign]
    rt.evaluate_slos = failing  # type: ignore[method-assign,assignment]

    async def passes() -> None:
        await scheduler._derive(rt)
        await scheduler._evaluate(rt)  # logged, not raised
        assert sys.getswitchinterval() == serving_interval
        with rt.pass_switching.computing():  # an overlapping pass: the derive pass ends first
            await scheduler._derive(rt)
            assert abs(sys.getswitchinterval() - 0.0005) < 1e-9
        assert sys.getswitchinterval() == serving_interval

    asyncio.run(passes())
    assert seen and all(abs(x - 0.0005) < 1e-9 for x in seen)
    assert Settings.model_validate({"data_dir": str(tmp_path)}).server.pass_switch_interval == 0.001
    rt.store.close()


def test_a_job_still_running_at_shutdown_says_so_in_a_line_not_a_traceback(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Shutdown waits for running passes up to `drain`'s limit and then stops waiting (the
    scheduler cancels the job's coroutine): one warning naming the job, nothing raised."""
    rt = Runtime(Settings.model_validate({"data_dir": str(tmp_path)}))

    async def slow() -> None:
        await asyncio.sleep(30)

    async def shutdown_midway() -> None:
        task = asyncio.create_task(rt.tracked(slow, "derive")())
        await asyncio.sleep(0.05)
        assert rt.inflight
        task.cancel()
        await task  # returns: the cancellation is the expected end of a job at shutdown
        assert not rt.inflight and rt.job_timings.runs["derive"] == 1

    asyncio.run(shutdown_midway())
    assert "derive was still running at shutdown and was not waited for" in caplog.text
    rt.store.close()
