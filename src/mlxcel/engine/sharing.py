"""Requests that share a prompt prefix with one that is running: its slot's KV state copied.

The prefix cache is per slot, so requests for the same long prompt that arrive together (an
agent's system prompt, a batch over one document) would each evaluate it from the start: the
slot that holds it is busy. Where the generator copies slots and a copy can be cut back
(`SharesPrefixes`: llama.cpp's sequences, MLX's plain KV caches through a saved state), a new
request whose prompt shares at least `MIN_GAIN` more tokens with a busy slot than with the
free slot it got takes a copy of that slot instead, trimmed to the shared prefix when its
slot opens. What the free slot held is kept in the prompt cache first,
as when a prompt replaces it.

Requests that arrive while such a prompt is still being evaluated (a cold server's first
burst, a request's several prompts) wait for it rather than evaluate the same tokens beside
it: on a CPU two evaluations of one prefix take twice the time of one, so both would answer
later (`awaits_prefill`).
"""

from __future__ import annotations

from collections.abc import Sequence

from mlxcel.engine.adapters import AdapterSet
from mlxcel.engine.cache_tiers import CacheTiers
from mlxcel.engine.capabilities import SavesState, SharesPrefixes
from mlxcel.engine.metrics import RecordsMetrics
from mlxcel.engine.prompt_cache import keep_slot_state
from mlxcel.engine.sequence import Job, Running
from mlxcel.engine.slots import SlotPool, common_prefix
from mlxcel.engine.types import TextGenerator

MIN_GAIN = 64
"""Tokens a copy must save: copying a slot moves its whole KV buffer (tens of MB on a small
model), about what evaluating a few dozen prompt tokens costs on a CPU."""


def reuse_prefix(
    generator: TextGenerator,
    pool: SlotPool,
    cache: CacheTiers | None,
    slot: int,
    shared: int,
    prompt: list[int],
    adapters: AdapterSet,
    metrics: RecordsMetrics,
) -> int:
    """The prompt tokens free slot `slot` holds once a busy slot's prefix computed with the
    request's `adapters` (where it is worth more than the `shared` tokens the slot holds), then
    the prompt cache's tiers, had their say."""
    source, longest = pool.busiest_match(prompt, adapters)
    if source >= 0 and longest >= shared + MIN_GAIN and _copies(generator):
        if cache is not None and isinstance(generator, SavesState):
            keep_slot_state(cache.ram, generator, slot, pool.slots[slot], shared)
        assert isinstance(generator, SharesPrefixes)
        generator.copy_slot(source, slot)
        pool.copied(slot, source)
        shared = longest
    if cache is None or not isinstance(generator, SavesState):
        return shared
    return cache.swap(generator, slot, pool.slots[slot], shared, prompt, metrics, adapters)


def awaits_prefill(
    generator: TextGenerator, pool: SlotPool, running: Sequence[Running], job: Job
) -> bool:
    """Whether waiting `job` should wait for a running sequence's prompt evaluation: that
    prompt shares at least `MIN_GAIN` more tokens with the job's than any slot holds now, and
    its slot can be copied once they are evaluated."""
    prompt, adapters = job.prompt, job.params.adapters
    if not job.params.cache_prompt or not _copies(generator):
        return False
    coming = max(
        (
            common_prefix(r.job.prompt, prompt)
            for r in running
            if r.prefilling and r.job.params.adapters == adapters
        ),
        default=0,
    )
    if coming < MIN_GAIN:
        return False
    held = max(
        (common_prefix(s.tokens, prompt) for s in pool.slots if s.adapters == adapters),
        default=0,
    )
    return min(coming, len(prompt) - 1) >= held + MIN_GAIN


def _copies(generator: TextGenerator) -> bool:
    """Whether the generator copies slots, and a copy saves evaluating its prefix."""
    return isinstance(generator, SharesPrefixes) and generator.shares_prefixes
