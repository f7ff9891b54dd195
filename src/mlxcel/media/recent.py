"""A small bounded cache of recent values by key: least recent dropped first."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Recent(Generic[K, V]):
    """Values by key, bounded by count and by the bytes `size` says each entry (key and value)
    takes; the least recently used go first. Safe to call from any thread."""

    def __init__(self, max_items: int, max_bytes: int, size: Callable[[K, V], int]) -> None:
        self._values: OrderedDict[K, V] = OrderedDict()
        self._bytes = 0
        self._max_items = max_items
        self._max_bytes = max_bytes
        self._size = size
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        """The value kept under `key`, or None."""
        with self._lock:
            value = self._values.get(key)
            if value is not None:
                self._values.move_to_end(key)
            return value

    def put(self, key: K, value: V) -> None:
        """Keep `value` under `key`, dropping the least recent past the bounds."""
        with self._lock:
            old = self._values.pop(key, None)
            if old is not None:
                self._bytes -= self._size(key, old)
            self._values[key] = value
            self._bytes += self._size(key, value)
            while len(self._values) > self._max_items or self._bytes > self._max_bytes:
                dropped_key, dropped = self._values.popitem(last=False)
                self._bytes -= self._size(dropped_key, dropped)
