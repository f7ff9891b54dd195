"""Which slot a new request gets: the free one whose kept KV state shares most of its prompt.

A slot's KV state outlives its request, so the slots double as the prefix cache: its size is
the number of slots, and among slots that share nothing the least recently used is reused.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from mlxcel.engine.adapters import AdapterSet


@dataclass
class SlotState:
    """What one slot holds: the tokens whose KV state it keeps, and when it was last used."""

    tokens: list[int] = field(default_factory=list)
    busy: bool = False
    last_used: float = 0.0
    request_id: str | None = None
    adapters: AdapterSet = ()
    """The LoRA adapters its KV state was computed with: another set shares none of it."""


class SlotReport(NamedTuple):
    """A slot as /slots shows it: its state, and its request's progress (0s when idle)."""

    state: SlotState
    decoded: int
    prompt_tokens: int
    remaining: int
    """Tokens its request may still generate; -1 when idle, as llama-server's `n_remain`."""
    new_line: bool


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest shared beginning of two token sequences."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class SlotPool:
    """The slots of one model and the token prefixes their KV state holds."""

    def __init__(self, n_slots: int) -> None:
        self.slots = [SlotState() for _ in range(n_slots)]

    @property
    def free_count(self) -> int:
        """Slots no request holds."""
        return sum(not s.busy for s in self.slots)

    @property
    def has_free(self) -> bool:
        """Whether a request could start now."""
        return self.free_count > 0

    def can_take(self, pinned: int) -> bool:
        """Whether a request could start now in slot `pinned` (-1: in any slot)."""
        return self.has_free if pinned < 0 else not self.slots[pinned].busy

    def choose(
        self, prompt: list[int], pinned: int = -1, adapters: AdapterSet = ()
    ) -> tuple[int, int]:
        """The free slot for `prompt` and how many of its tokens already sit in its KV state
        (computed with the same `adapters`: a slot of another set shares nothing).

        `pinned` >= 0 asks for that slot. At least one prompt token is always left to
        evaluate, since sampling needs its logits.
        """
        best, best_shared = -1, -1
        for index, slot in enumerate(self.slots):
            if slot.busy or pinned not in (-1, index):
                continue
            held = slot.tokens if slot.adapters == adapters else ()
            shared = min(common_prefix(held, prompt), len(prompt) - 1)
            better = shared > best_shared or (
                shared == best_shared and slot.last_used < self.slots[best].last_used
            )
            if better:
                best, best_shared = index, shared
        if best < 0:
            raise RuntimeError("no free slot")
        return best, best_shared

    def busiest_match(self, prompt: list[int], adapters: AdapterSet) -> tuple[int, int]:
        """The busy slot of `adapters` whose tokens share most of `prompt`, and how many
        (at most all but the prompt's last); (-1, 0) when none shares any."""
        best, best_shared = -1, 0
        for index, slot in enumerate(self.slots):
            if slot.busy and slot.adapters == adapters:
                shared = min(common_prefix(slot.tokens, prompt), len(prompt) - 1)
                if shared > best_shared:
                    best, best_shared = index, shared
        return best, best_shared

    def copied(self, index: int, source: int) -> None:
        """Slot `index` now holds what slot `source` holds."""
        self.slots[index].tokens = list(self.slots[source].tokens)
        self.slots[index].adapters = self.slots[source].adapters

    def claim(self, index: int, request_id: str, kept: int, adapters: AdapterSet = ()) -> None:
        """Give the slot to a request that keeps the first `kept` tokens of its state and
        runs with `adapters`."""
        slot = self.slots[index]
        slot.busy = True
        slot.request_id = request_id
        slot.tokens = slot.tokens[:kept]
        slot.adapters = adapters

    def fed(self, index: int, tokens: Sequence[int]) -> None:
        """Record tokens evaluated into a slot's KV state."""
        self.slots[index].tokens.extend(tokens)

    def release(self, index: int, *, keep: bool) -> None:
        """The slot's request is over; `keep` its KV state as cache, or forget it."""
        slot = self.slots[index]
        slot.busy = False
        slot.request_id = None
        slot.last_used = time.monotonic()
        if not keep:
            slot.tokens = []
