"""The host-memory prompt cache (--cache-ram) on the MLX engine: KV state to bytes and back."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mlx_lm")

import mlx.core as mx
from mlx_lm.models.cache import ArraysCache, CacheList, KVCache, RotatingKVCache
from mlx_lm.models.deepseek_v41 import LayerCache

from mlxcel.backends.mlx import MlxGenerator, MlxOptions
from mlxcel.backends.mlx.kv_state import from_bytes, to_bytes, unsaveable
from mlxcel.engine.capabilities import SavesState, SharesPrefixes
from mlxcel.engine.types import Feed, Sample, SamplingParams
from tests.conftest import LLAMA_DIR, start
from tests.server_process import ServerProcess
from tests.test_mlx_batching import _sliding_window
from tests.test_prompt_cache import _ask

HEADS, HEAD_DIM = 2, 16
# Greedy, with the log-probabilities that show the logits came out the same.
GREEDY = SamplingParams(max_tokens=64, temperature=0, top_p=1, top_k=0, min_p=0, logprobs=3)


def _rows(tokens: int, dtype: mx.Dtype, seed: int) -> mx.array:
    return mx.random.normal((1, HEADS, tokens, HEAD_DIM), key=mx.random.key(seed)).astype(dtype)


def _filled(cache: Any, tokens: int, dtype: mx.Dtype, *, one_by_one: bool = False) -> Any:
    for seed, count in enumerate([1] * tokens if one_by_one else [tokens]):
        cache.update_and_fetch(_rows(count, dtype, seed), _rows(count, dtype, seed + 1000))
    return cache


def _next_step(layer: Any, dtype: mx.Dtype) -> list[mx.array]:
    """What the layer hands attention after one more token."""
    keys, values = layer.update_and_fetch(_rows(1, dtype, 7), _rows(1, dtype, 8))
    return [keys, values]


def _kv_caches() -> list[tuple[Any, mx.Dtype]]:
    trimmed = _filled(KVCache(), 40, mx.bfloat16)
    trimmed.trim(5)
    rotated = _filled(RotatingKVCache(max_size=8), 20, mx.float16, one_by_one=True)
    growing = _filled(RotatingKVCache(max_size=300), 12, mx.bfloat16, one_by_one=True)
    return [(trimmed, mx.bfloat16), (rotated, mx.float16), (growing, mx.bfloat16)]


def test_every_cache_kind_comes_back_exactly_and_in_its_bytes() -> None:
    caches = _kv_caches()
    recurrent = ArraysCache(2)
    recurrent[0] = _rows(3, mx.bfloat16, 9)
    mixed = CacheList(_filled(KVCache(), 6, mx.float32), ArraysCache(1))
    layers = [cache for cache, _ in caches] + [recurrent, mixed]
    data = to_bytes(layers, list(range(35)))
    restored, tokens, _, _ = from_bytes(data)
    assert tokens == list(range(35))
    assert [type(layer) for layer in restored] == [type(layer) for layer in layers]
    for (original, dtype), copy in zip(caches, restored, strict=False):
        assert copy.offset == original.offset and copy.keys.dtype == dtype
        for mine, theirs in zip(_next_step(original, dtype), _next_step(copy, dtype), strict=True):
            assert mx.array_equal(mine, theirs).item()
    assert mx.array_equal(restored[3][0], recurrent[0]).item() and restored[3][1] is None
    assert mx.array_equal(restored[4][0].keys, mixed[0].keys[..., :6, :]).item()
    assert restored[4][1].empty()
    # Only the rows that hold tokens: 35 of the trimmed cache's 256, 8 of the window, 12 of
    # the growing one's 256.
    kv_bytes = 2 * HEADS * HEAD_DIM * (35 * 2 + 8 * 2 + 12 * 2 + 6 * 4) + HEADS * 3 * HEAD_DIM * 2
    assert kv_bytes < len(data) < kv_bytes + 35 * 4 + 2048


def test_a_cache_kind_that_cannot_be_saved_is_named() -> None:
    layers = [KVCache(), LayerCache(8)]
    assert unsaveable(layers) == ["LayerCache"]
    with pytest.raises(TypeError, match="LayerCache"):
        to_bytes(layers, [1, 2])


def _greedy(generator: MlxGenerator, slot: int, token: int, count: int) -> list[Sample]:
    """`count` greedy samples of the slot alone, starting by feeding `token`."""
    samples = []
    for _ in range(count):
        (sample,) = generator.step([Feed(slot, [token], True)])
        assert sample is not None
        samples.append(sample)
        token = sample.token
    return samples


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["plain", "sliding"])
def test_a_saved_state_continues_the_same_in_another_slot(
    models: Path, tmp_path: Path, kind: str
) -> None:
    path = models / LLAMA_DIR if kind == "plain" else _sliding_window(models, tmp_path / kind)
    generator = MlxGenerator(path, MlxOptions(ctx_size=2048, parallel=3, batch_size=512))
    try:
        assert isinstance(generator, SavesState) and generator.can_save_state
        # A rotating window cannot be cut back to a shared prefix: no slot is copied.
        assert isinstance(generator, SharesPrefixes)
        assert generator.shares_prefixes == (kind == "plain")
        text = "Once upon a time a dragon and a king sat by the river. " * 4
        prompt = generator.tokenize(text, add_special=True, parse_special=False)
        other = generator.tokenize("The cat", add_special=True, parse_special=False)
        generator.open_slot(0, GREEDY)
        generator.open_slot(1, GREEDY)
        (first,) = generator.step([Feed(0, prompt, True)])
        assert first is not None
        # Slot 0 is saved while it is a row of the decode batch, beside slot 1.
        second, _ = generator.step([Feed(0, [first.token], True), Feed(1, other, True)])
        assert second is not None
        data = generator.save_state(0)
        assert generator.load_state(2, data)
        generator.open_slot(2, GREEDY, reuse=len(prompt) + 1)
        expected = _greedy(generator, 0, second.token, 6)
        assert _greedy(generator, 2, second.token, 6) == expected
        # Loaded, then cut back to part of the prompt like a slot's own state.
        generator.close_slot(2)
        assert generator.load_state(2, data)
        generator.open_slot(2, GREEDY, reuse=len(prompt) - 1)
        assert generator.step([Feed(2, prompt[-1:], True)]) == [first]
    finally:
        generator.close()


def _mlx_server(models: Path, tmp: pytest.TempPathFactory, *args: str) -> ServerProcess:
    model = ["-m", str(models / LLAMA_DIR), "--backend", "mlx"]
    return start(tmp.mktemp("mlx-cache"), *model, *args)


@pytest.fixture(scope="module")
def cached(models: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    proc = _mlx_server(models, tmp_path_factory)
    yield proc
    proc.stop_soon()


@pytest.fixture(scope="module")
def uncached(models: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    proc = _mlx_server(models, tmp_path_factory, "--cache-ram", "0")
    yield proc
    proc.stop_soon()


def _back_to_the_moon(server: ServerProcess) -> tuple[bool, int, int, float]:
    """Ask about the moon, volcanoes, the moon again (one slot: each takes the last one's).

    Whether both moon answers agree, the prompt's tokens, the cached tokens of the second
    moon prompt, and the prompt cache's bytes while the first moon waited in it.
    """
    moon, prompt_tokens, first_cached = _ask(server, "the moon")
    assert first_cached == 0
    _ask(server, "volcanoes")
    saved = server.metric("mlxcel_prompt_cache_ram_bytes")
    again, _, cached_tokens = _ask(server, "the moon")
    return again == moon, prompt_tokens, cached_tokens, saved


@pytest.mark.slow
def test_a_prompt_evicted_from_the_slot_comes_back_from_ram(cached: ServerProcess) -> None:
    same, prompt_tokens, cached_tokens, saved = _back_to_the_moon(cached)
    assert same and cached_tokens >= prompt_tokens - 1
    assert cached.metric("mlxcel_prompt_cache_ram_loads_total") >= 1
    # The tiny Llama keeps 512 bytes of keys and values a token (prompt and answer), plus
    # 4 bytes for the token itself and a header.
    assert 512 * prompt_tokens < saved < 520 * (prompt_tokens + 12) + 4096


@pytest.mark.slow
def test_without_the_cache_the_evicted_prompt_is_evaluated_again(uncached: ServerProcess) -> None:
    same, prompt_tokens, cached_tokens, saved = _back_to_the_moon(uncached)
    # Only the template's opening tokens are shared with the volcano prompt.
    assert same and cached_tokens < prompt_tokens // 4 and saved == 0
