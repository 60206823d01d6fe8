"""Type stub of the C scanner (_otlpscan.c)."""

from collections.abc import Callable
from collections.abc import Set as AbstractSet
from types import NotImplementedType
from typing import TypeVar

T = TypeVar("T")

def scan(
    body: bytes | bytearray | memoryview, wanted: AbstractSet[str] | None, record: Callable[..., T]
) -> list[T] | NotImplementedType: ...
