"""The store reads a test watches: how long a span each `Store.read_rows` call asked for."""

from __future__ import annotations

from typing import Any

import pytest

from collector.store.repository import Store


def record_reads(
    monkeypatch: pytest.MonkeyPatch, store: Store, period: int | None = None, nonempty: bool = False
) -> list[int]:
    """Wrap `store.read_rows` (for the test's duration) so that each call's span, end - start,
    is appended to the list returned; with `period`, only the reads of that period's cells;
    with `nonempty`, only the reads that found rows."""
    spans: list[int] = []
    read = store.read_rows

    def recorded(start: int, end: int, *args: Any, **kwargs: Any) -> Any:
        rows = read(start, end, *args, **kwargs)
        if (period is None or kwargs.get("period") == period) and (rows or not nonempty):
            spans.append(end - start)
        return rows

    monkeypatch.setattr(store, "read_rows", recorded)
    return spans
