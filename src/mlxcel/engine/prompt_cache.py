"""Prompt KV state kept in host memory after it leaves a slot (llama-server's --cache-ram).

The slots hold one prefix each. When a request takes a slot whose state it does not share, the
state it would overwrite is saved here; a later request that shares more with a saved entry
than with any slot gets that entry loaded back into its slot. Bounded in bytes, least recently
used first out.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from mlxcel.engine.slots import common_prefix


@dataclass(frozen=True)
class CacheEntry:
    """One saved sequence: the tokens its state holds, and the backend's bytes for it."""

    tokens: tuple[int, ...]
    data: bytes


class PromptCache:
    """Saved slot states by token prefix; `max_bytes` < 0 means no limit."""

    def __init__(self, max_bytes: int) -> None:
        self._max_bytes = max_bytes
        self._entries: OrderedDict[tuple[int, ...], CacheEntry] = OrderedDict()
        self.total_bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def best(self, prompt: list[int]) -> tuple[CacheEntry | None, int]:
        """The entry sharing the longest beginning with `prompt`, and how long that is."""
        found, longest = None, 0
        for entry in self._entries.values():
            shared = common_prefix(entry.tokens, prompt)
            if shared > longest:
                found, longest = entry, shared
        return found, longest

    def take(self, entry: CacheEntry) -> None:
        """Remove an entry that is going back into a slot (the slot is its copy now)."""
        if self._entries.pop(entry.tokens, None) is not None:
            self.total_bytes -= len(entry.data)

    def put(self, tokens: list[int], data: bytes) -> None:
        """Keep a slot's state; entries it extends are dropped, the oldest go past the limit."""
        if 0 <= self._max_bytes < len(data):
            return
        key = tuple(tokens)
        for old in [k for k in self._entries if key[: len(k)] == k]:
            self.total_bytes -= len(self._entries.pop(old).data)
        self._entries[key] = CacheEntry(key, data)
        self.total_bytes += len(data)
        while 0 <= self._max_bytes < self.total_bytes:
            _, oldest = self._entries.popitem(last=False)
            self.total_bytes -= len(oldest.data)
