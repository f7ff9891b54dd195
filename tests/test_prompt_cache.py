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


def test_a_newer_state_that_covers_most_of_a_kept_one_replaces_it() -> None:
    cache = PromptCache(max_bytes=-1)
    system = list(range(100))
    cache.put([*system, 1, 2, 3], b"first question")
    cache.put([*system, 4, 5, 6], b"second question")  # shares 100 of the first's 103 tokens
    assert len(cache) == 1
    entry, shared = cache.best([*system, 1, 2, 3])
    assert entry is not None and entry.data == b"second question" and shared == 100
    cache.put([*system[:50], 7], b"other")  # shares 50 of 103: both kept
    assert len(cache) == 2 and cache.total_bytes == len(b"second question") + len(b"other")


@pytest.fixture(scope="module")
def cached(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    yield from serving(tmp_path_factory, "cache", "--cache-ram", "64")


@pytest.fixture(scope="module")
def uncached(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    yield from serving(tmp_path_factory, "no-cache", "--cache-ram", "0")


def _ask(server: ServerProcess, topic: str, question: str = "") -> tuple[str, int, int]:
    """(answer, prompt tokens, cached tokens) for a long prompt about `topic` (and the user's
    `question`, by default "Tell me about" it), greedily."""
    client = server.openai()
    messages: list[Any] = [
        {"role": "system", "content": f"You are an expert on {topic}. " * 30},
        {"role": "user", "content": question or f"Tell me about {topic}."},
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
def test_questions_on_one_system_prompt_keep_one_copy_of_it(cached: ServerProcess) -> None:
    """Two requests on one long system prompt with their own questions leave one saved state
    of that prompt in RAM, not two, and a third question still finds it."""
    _, prompt_tokens, _ = _ask(cached, "glaciers", "How do they form?")
    before = cached.metric("mlxcel_prompt_cache_ram_bytes")
    _ask(cached, "glaciers", "Where are they found?")  # the first question's state is saved
    one = cached.metric("mlxcel_prompt_cache_ram_bytes") - before
    _ask(cached, "deserts")  # the second's is saved, and covers the first's: it replaces it
    both = cached.metric("mlxcel_prompt_cache_ram_bytes") - before
    assert one > 0 and both < 1.5 * one
    _, _, cached_tokens = _ask(cached, "glaciers", "Why do they move?")
    assert cached_tokens >= prompt_tokens - 12  # all but the first question's own words


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
