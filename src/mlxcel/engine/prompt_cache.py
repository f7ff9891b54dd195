"""Prompt KV state kept in host memory after it leaves a slot (llama-server's --cache-ram).

The slots hold one prefix each. When a request takes a slot whose state it does not share, the
state it would overwrite is saved here; a later request that shares more with a saved entry
than with any slot gets that entry loaded back into its slot. Bounded in bytes, least recently
used first out.
"""

from __future__ import annotations

import logging
import math
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from mlxcel.engine.adapters import AdapterSet
from mlxcel.engine.capabilities import SavesState
from mlxcel.engine.metrics import RecordsMetrics
from mlxcel.engine.slots import SlotState, common_prefix

logger = logging.getLogger(__name__)

# A slot's state is saved to the prompt cache only when this many of its tokens would be lost.
MIN_SAVED_TOKENS = 16
# A kept entry that shares at least this share of its tokens with a newer one is dropped for
# it: requests on one system prompt with their own questions would otherwise fill the cache
# with copies of that prompt, and push other prompts out.
COVERED_SHARE = 0.9


@dataclass(frozen=True)
class CacheEntry:
    """One saved sequence: the tokens its state holds, and the backend's bytes for it."""

    tokens: tuple[int, ...]
    data: bytes
    adapters: AdapterSet = ()
    """The LoRA adapters its state was computed with: only a prompt run with the same set
    may load it back."""

    @property
    def key(self) -> tuple[AdapterSet, tuple[int, ...]]:
        """What identifies it: its adapter set and its tokens."""
        return self.adapters, self.tokens


class PromptCache:
    """Saved slot states by token prefix; `max_bytes` < 0 means no limit. What leaves for
    room (or never fits) goes to `spill`, the disk tier's writer, when there is one."""

    def __init__(self, max_bytes: int, spill: Callable[[CacheEntry], None] | None = None) -> None:
        self._max_bytes = max_bytes
        self._spill = spill
        self._entries: OrderedDict[tuple[AdapterSet, tuple[int, ...]], CacheEntry] = OrderedDict()
        self.total_bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def best(self, prompt: list[int], adapters: AdapterSet = ()) -> tuple[CacheEntry | None, int]:
        """The entry of the same adapter set sharing the longest beginning with `prompt`, and
        how long that is."""
        found, longest = None, 0
        for entry in self._entries.values():
            if entry.adapters != adapters:
                continue
            shared = common_prefix(entry.tokens, prompt)
            if shared > longest:
                found, longest = entry, shared
        return found, longest

    def newest_first(self) -> list[CacheEntry]:
        """Every entry, the most recently kept first."""
        return list(reversed(self._entries.values()))

    def take(self, entry: CacheEntry) -> None:
        """Remove an entry that is going back into a slot (the slot is its copy now)."""
        if self._entries.pop(entry.key, None) is not None:
            self.total_bytes -= len(entry.data)

    def put(self, tokens: list[int], data: bytes, adapters: AdapterSet = ()) -> None:
        """Keep a slot's state; entries of its set that it mostly covers (`COVERED_SHARE` of
        their tokens, as any it extends) are dropped, the oldest go past the limit."""
        entry = CacheEntry(tuple(tokens), data, adapters)
        if 0 <= self._max_bytes < len(data):
            if self._spill is not None:
                self._spill(entry)
            return
        for old in [k for k in self._entries if k[0] == adapters and _covered(k[1], entry.tokens)]:
            self.total_bytes -= len(self._entries.pop(old).data)
        self._entries[entry.key] = entry
        self.total_bytes += len(data)
        while 0 <= self._max_bytes < self.total_bytes:
            _, oldest = self._entries.popitem(last=False)
            self.total_bytes -= len(oldest.data)
            if self._spill is not None:
                self._spill(oldest)


def _covered(old: tuple[int, ...], new: tuple[int, ...]) -> bool:
    """Whether `new` shares at least COVERED_SHARE of `old`'s tokens from their start (one
    slice comparison: this runs over every entry on the engine thread)."""
    n = math.ceil(COVERED_SHARE * len(old))
    return old[:n] == new[:n]


def swap_cached(
    cache: PromptCache,
    generator: SavesState,
    slot: int,
    state: SlotState,
    shared: int,
    prompt: list[int],
    metrics: RecordsMetrics,
    adapters: AdapterSet = (),
) -> int:
    """Save what slot `slot` (whose tokens are `state`'s) would lose to the cache, and load a
    saved state of the prompt's adapter set that shares more of `prompt` than the slot does;
    the prompt tokens the slot now holds."""
    keep_slot_state(cache, generator, slot, state, shared)
    return load_cached(cache, generator, slot, state, shared, prompt, metrics, adapters)


def keep_slot_state(
    cache: PromptCache, generator: SavesState, slot: int, state: SlotState, shared: int
) -> None:
    """Save the slot's state to the cache when a prompt sharing `shared` tokens of it would
    lose enough of it."""
    held = state.tokens
    if len(held) - shared >= MIN_SAVED_TOKENS:
        cache.put(held, generator.save_state(slot), state.adapters)


def load_cached(
    cache: PromptCache,
    generator: SavesState,
    slot: int,
    state: SlotState,
    shared: int,
    prompt: list[int],
    metrics: RecordsMetrics,
    adapters: AdapterSet = (),
) -> int:
    """Load the saved state of the prompt's adapter set sharing most of `prompt` into the
    slot, where it shares more than the slot's own `shared` tokens; the prompt tokens the slot
    now holds."""
    entry, longest = cache.best(prompt, adapters)
    longest = min(longest, len(prompt) - 1)
    if entry is not None and longest > shared:
        cache.take(entry)
    metrics.cache_size(cache.total_bytes)
    if entry is None or longest <= shared:
        return shared
    if not generator.load_state(slot, entry.data):
        logger.warning("a saved prompt state did not fit its slot; evaluating the prompt")
        state.tokens = []
        return 0
    state.tokens = list(entry.tokens)
    metrics.cache_loaded()
    return longest
