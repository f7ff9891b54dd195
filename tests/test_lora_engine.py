"""The engine's side of LoRA adapters, without a model: sets compare by content, turns
between sets, and the slot pool and prompt cache keyed by the set."""

from __future__ import annotations

import pytest

from mlxcel.engine.adapters import ADAPTER_TURN_STEPS, Turns, adapter_set
from mlxcel.engine.prompt_cache import PromptCache
from mlxcel.engine.slots import SlotPool


def test_a_set_drops_zero_scales_and_sorts() -> None:
    assert adapter_set({"b": 0.5, "a": 1.0, "c": 0.0}) == (("a", 1.0), ("b", 0.5))
    assert adapter_set({"a": 0.0}) == ()
    with pytest.raises(ValueError, match="finite"):
        adapter_set({"a": float("nan")})


def test_sets_take_turns_and_one_set_keeps_the_engine() -> None:
    one, two = (("a", 1.0),), (("b", 1.0),)
    turns = Turns()
    assert [turns.pick([one, one]) for _ in range(10)] == [one] * 10
    picked = [turns.pick([one, two]) for _ in range(4 * ADAPTER_TURN_STEPS)]
    assert picked.count(one) == picked.count(two) == 2 * ADAPTER_TURN_STEPS
    runs = [picked[i : i + ADAPTER_TURN_STEPS] for i in range(0, len(picked), ADAPTER_TURN_STEPS)]
    assert all(len(set(run)) == 1 for run in runs)
    assert turns.pick([two]) == two  # the set that is left runs at once


def test_a_slot_shares_its_prefix_only_with_its_own_set() -> None:
    pool = SlotPool(1)
    pool.claim(0, "r1", 0, (("a", 1.0),))
    pool.fed(0, [1, 2, 3, 4])
    pool.release(0, keep=True)
    assert pool.choose([1, 2, 3, 4, 5], adapters=(("a", 1.0),)) == (0, 4)
    assert pool.choose([1, 2, 3, 4, 5], adapters=(("a", 0.5),)) == (0, 0)
    assert pool.choose([1, 2, 3, 4, 5]) == (0, 0)


def test_the_prompt_cache_keeps_each_set_apart() -> None:
    cache = PromptCache(max_bytes=-1)
    cache.put([1, 2, 3], b"alpha", (("a", 1.0),))
    cache.put([1, 2], b"base")
    assert len(cache) == 2  # the base's shorter prefix is not dropped for alpha's longer one
    entry, shared = cache.best([1, 2, 3, 4])
    assert entry is not None and entry.data == b"base" and shared == 2
    entry, shared = cache.best([1, 2, 3, 4], (("a", 1.0),))
    assert entry is not None and entry.data == b"alpha" and shared == 3
    assert cache.best([1, 2, 3, 4], (("b", 1.0),)) == (None, 0)
    cache.take(entry)
    assert len(cache) == 1 and cache.total_bytes == len(b"base")
