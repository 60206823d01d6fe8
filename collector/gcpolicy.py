"""The interpreter settings a long-running collector needs: the cyclic garbage collector kept from
stopping it for a second at a time, and a switch interval that lets the event loop run while a
worker thread computes.

At a thousand targets llmslo holds about two million objects that the cyclic collector tracks
(cells, series identities, the parsed-line caches); a full collection walks every one of them and
stops every thread for 1-1.5 s, and each derive pass leaves enough long-lived objects behind to
start one every pass or two: the event loop (every scrape, every request, /metrics) stood still
for that long (measured: stalls of 130-730 ms every ~15 s). Nearly all of these objects are freed
by reference counting, not by the cyclic collector.

So after each derive pass the objects alive are moved to the permanent generation (`gc.freeze`):
the collections that follow walk only what was made since, and reference counting still frees
frozen objects as usual. Once an hour `collect_frozen` puts them back (`gc.unfreeze`) and runs one
full collection, which frees the reference cycles that died while frozen (tasks and exceptions
caught mid-flight: a few thousand objects an hour), so nothing is kept for good. That one
collection is the hourly pause of about a second at a thousand targets.

The youngest generation is collected every 50,000 allocations instead of 700: a trace batch
allocates tens of thousands of short-lived containers, and collecting every 700 scanned each
batch's records several times over (a third of the ingest CPU), while at 50,000 nearly all are
freed first.

The switch interval: while a derive or drift pass computes in a worker thread, the event loop
(every scrape, every request) gives up the interpreter at each socket operation and waits up to
the switch interval to get it back. `server.switch_interval` sets it; Python's 5 ms is the
default. Measured at a thousand targets (same machine, back to back): at 5 ms, 5.98 ms of CPU per
scrape and GET /metrics 258 ms median, 1.1 s worst; at 0.5 ms, 6.90 ms of CPU (+15 %) and
155 ms median, 0.5 s worst. So the short interval is used only while a periodic pass computes
(`PassSwitching`, `server.pass_switch_interval`, 1 ms): that is when the event loop waits, and
the rest of the time (most of it) pays nothing for it.
"""

from __future__ import annotations

import gc
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

COLLECT_FROZEN_SECONDS = 3600.0
THRESHOLDS = (50_000, 20, 20)  # the youngest generation collected every 50,000 allocations


@contextmanager
def serving(switch_interval_seconds: float) -> Iterator[None]:
    """While a collector serves: what exists at start-up frozen, the young generation collected
    every 50,000 allocations, the given switch interval; the interpreter's own put back after."""
    thresholds, interval = gc.get_threshold(), sys.getswitchinterval()
    gc.freeze()  # what exists now lives as long as the process
    gc.set_threshold(*THRESHOLDS)
    sys.setswitchinterval(switch_interval_seconds)
    try:
        yield
    finally:
        sys.setswitchinterval(interval)
        gc.set_threshold(*thresholds)


def offline() -> None:
    """For a command that reads history (`llmslo report`, `cost`, `slo`, ...): the youngest
    generation collected every 50,000 allocations, as while serving. A long read makes millions
    of cells that live until its consumers are done with them; collected every 700 allocations,
    they were scanned again and again (half the CPU of decoding stored rows; a weekly report of
    100 targets' day of minutes took 75 s, 55 s with this and orjson's decode)."""
    gc.set_threshold(*THRESHOLDS)


def freeze() -> None:
    """Move every tracked object to the permanent generation (constant time: lists are spliced)."""
    gc.freeze()


def collect_frozen() -> int:
    """Put the permanent generation back and collect everything; returns the objects freed."""
    gc.unfreeze()
    return gc.collect()


class PassSwitching:
    """The switch interval while a periodic pass (derive, drift, SLO evaluation) computes in a
    worker thread: shorter than the serving one, so that the event loop (every scrape, every
    request) waits less for the interpreter after each socket operation; the serving interval
    is put back once no pass runs. Passes may overlap: the first one in sets it, the last one
    out puts it back."""

    def __init__(self, interval_seconds: float) -> None:
        self.interval = interval_seconds
        self.running = 0
        self.saved = sys.getswitchinterval()
        self.lock = threading.Lock()

    @contextmanager
    def computing(self) -> Iterator[None]:
        with self.lock:
            if self.running == 0:
                self.saved = sys.getswitchinterval()
                sys.setswitchinterval(min(self.interval, self.saved))
            self.running += 1
        try:
            yield
        finally:
            with self.lock:
                self.running -= 1
                if self.running == 0:
                    sys.setswitchinterval(self.saved)
