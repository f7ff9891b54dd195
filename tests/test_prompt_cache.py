"""The host-memory prompt cache (--cache-ram): slot states saved when evicted, loaded back."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from mlxcel.engine.prompt_cache import PromptCache
from mlxcel.engine.slots import common_prefix
from tests.conftest import serving
from tests.server_process import ServerProcess


def test_cache_keeps_the_longest_and_evicts_the_oldest() -> None:
    cache = PromptCache(max_bytes=10)
    cache.put([1, 2], b"aaaa")
    cache.put([1, 2, 3], b"bbbb")  # extends [1, 2], which goes
    assert len(cache) == 1 and cache.total_bytes == 4
    cache.put([7, 8], b"cccc")
    entry, shared = cache.best([1, 2, 3, 4])
    assert entry is not None and entry.data == b"bbbb" and shared == 3
    cache.put([9], b"dddd")  # 12 bytes: the oldest ([1, 2, 3]) goes
    assert cache.best([1, 2, 3, 4]) == (None, 0) and cache.total_bytes == 8
    cache.put([5], b"x" * 11)  # bigger than the whole cache: not kept
    assert len(cache) == 2
    found, _ = cache.best([7, 8, 9])
    assert found is not None
    cache.take(found)
    assert len(cache) == 1 and cache.total_bytes == 4
    unlimited = PromptCache(max_bytes=-1)
    unlimited.put([1], b"y" * 1000)
    assert unlimited.total_bytes == 1000


@pytest.fixture(scope="module")
def cached(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    yield from serving(tmp_path_factory, "cache", "--cache-ram", "64")


@pytest.fixture(scope="module")
def uncached(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    yield from serving(tmp_path_factory, "no-cache", "--cache-ram", "0")


def _ask(server: ServerProcess, topic: str) -> tuple[str, int, int]:
    """(answer, prompt tokens, cached tokens) for a long prompt about `topic`, greedily."""
    client = server.openai()
    messages: list[Any] = [
        {"role": "system", "content": f"You are an expert on {topic}. " * 30},
        {"role": "user", "content": f"Tell me about {topic}."},
    ]
    answer = client.chat.completions.create(
        model="default", messages=messages, max_tokens=12, temperature=0
    )
    usage = answer.usage
    assert usage is not None and usage.prompt_tokens_details is not None
    cached = usage.prompt_tokens_details.cached_tokens or 0
    return answer.choices[0].message.content or "", usage.prompt_tokens, cached


@pytest.mark.slow
def test_a_conversation_evicted_from_the_slot_comes_back_from_ram(cached: ServerProcess) -> None:
    # One slot (the default): the second topic takes the slot the first one filled.
    moon, prompt_tokens, first_cached = _ask(cached, "the moon")
    _ask(cached, "volcanoes")
    assert cached.metric("mlxcel_prompt_cache_ram_bytes") > 0
    again, _, cached_tokens = _ask(cached, "the moon")
    assert first_cached == 0 and cached_tokens >= prompt_tokens - 1
    assert again == moon  # the restored state gives the same greedy answer
    assert cached.metric("mlxcel_prompt_cache_ram_loads_total") >= 1


@pytest.mark.slow
def test_without_the_cache_the_evicted_prefix_is_evaluated_again(uncached: ServerProcess) -> None:
    moon, prompt_tokens, _ = _ask(uncached, "the moon")
    _ask(uncached, "volcanoes")
    again, _, cached_tokens = _ask(uncached, "the moon")
    # Only the template's opening tokens are shared with the volcano prompt.
    assert cached_tokens < prompt_tokens // 4 and again == moon


@pytest.mark.parametrize(
    ("a", "b", "shared"),
    [
        ([], [1], 0),
        ([1, 2, 3], [1, 2, 3], 3),
        ([1, 2, 3], [1, 2, 3, 4], 3),
        ([1, 2, 3, 4], [1, 2, 9, 4], 2),
        ([5], [6], 0),
        (list(range(1000)), [*range(777), -1], 777),
    ],
)
def test_common_prefix(a: list[int], b: list[int], shared: int) -> None:
    assert common_prefix(a, b) == shared == common_prefix(tuple(b), tuple(a))
