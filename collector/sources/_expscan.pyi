"""Type stub of the C steady-state scanner (_expscan.c)."""

from collections.abc import Callable
from typing import Any

def scan(
    text: str,
    entries: dict[str, Any],
    sample_limit: int,
    comment: Callable[[str, int], None],
    comments: dict[str, tuple[str, str] | None],
    types: dict[str, str],
    layout: list[tuple[str, object]],
    /,
) -> list[tuple[Any, float, int, str]] | None: ...
