"""A slot's KV cache and the tokens it holds as bytes (the host-memory prompt cache), and back;
with the embedding rows of the images among them and, after M-RoPE images, where its positions
stop being token indices (without those the next tokens would sit at the wrong positions).

The bytes are a safetensors file: the layers' arrays in their own dtype (bf16 included), and
in its metadata each layer's cache kind with its state, an array standing there as its key.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple, cast

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import (
    ArraysCache,
    CacheList,
    ChunkedKVCache,
    KVCache,
    RotatingKVCache,
    can_trim_prompt_cache,
)

from mlxcel.engine.positions import Jumps

# The cache kinds the models build whose `state` holds only arrays, numbers, strings and None,
# and whose `from_state` rebuilds them from it.
_KINDS: dict[str, type[Any]] = {
    kind.__name__: kind
    for kind in (KVCache, RotatingKVCache, ChunkedKVCache, ArraysCache, CacheList)
}
_TOKENS = "tokens"
_LAYERS = "layers"
_JUMPS = "jumps"
_MEDIA = "media."


def _layers(cache: list[Any]) -> Iterator[Any]:
    for layer in cache:
        yield layer
        if isinstance(layer, CacheList):
            yield from _layers(list(layer.caches))


def unsaveable(cache: list[Any]) -> list[str]:
    """The cache kinds among a model's layers whose state cannot be saved."""
    return sorted(
        {type(layer).__name__ for layer in _layers(cache) if type(layer) not in _KINDS.values()}
    )


def _rows_used(layer: Any) -> int | None:
    """How many rows of the layer's key buffer hold tokens; None when all of them do."""
    if not isinstance(layer, KVCache | ChunkedKVCache | RotatingKVCache) or layer.keys is None:
        return None
    used = layer.offset - getattr(layer, "start_position", 0)
    return used if used < layer.keys.shape[2] else None


def _state(layer: Any) -> Any:
    """The layer's state, without the room its key and value buffers keep for later tokens."""
    if isinstance(layer, CacheList):
        return [(_state(sub), type(sub).__name__) for sub in layer.caches]
    used = _rows_used(layer)
    if used is None:
        return layer.state
    # Grown in steps of 256 rows, or trimmed: what lies past the tokens is never read.
    return (layer.keys[..., :used, :], layer.values[..., :used, :], *layer.state[2:])


def _encode(value: Any, arrays: dict[str, mx.array]) -> Any:
    if isinstance(value, mx.array):
        key = str(len(arrays))
        arrays[key] = value
        return {"array": key}
    if isinstance(value, list | tuple):
        return [_encode(item, arrays) for item in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    raise TypeError(f"a KV cache state cannot hold {type(value).__name__}")


def _decode(value: Any, arrays: dict[str, mx.array]) -> Any:
    if isinstance(value, dict):
        return arrays[value["array"]]
    if isinstance(value, list):
        return [_decode(item, arrays) for item in value]
    return value


class SavedState(NamedTuple):
    """What `from_bytes` gives back."""

    cache: list[Any]
    tokens: list[int]
    media: dict[int, np.ndarray]
    jumps: Jumps


def to_bytes(
    cache: list[Any],
    tokens: list[int],
    media: Mapping[int, np.ndarray] | None = None,
    jumps: Jumps | None = None,
) -> bytes:
    """The cache's state, the tokens it holds, the rows of the images among them (by their
    first token's index) and its jumps; raises TypeError for a kind not saveable."""
    if missing := unsaveable(cache):
        raise TypeError(f"cannot save the state of {', '.join(missing)}")
    arrays: dict[str, mx.array] = {
        _TOKENS: mx.array(tokens, dtype=mx.int32),
        _JUMPS: mx.array(np.frombuffer((jumps or Jumps()).to_bytes(), np.uint8)),
    }
    arrays.update({f"{_MEDIA}{start}": mx.array(rows) for start, rows in (media or {}).items()})
    layers = [(type(layer).__name__, _encode(_state(layer), arrays)) for layer in cache]
    buffer = io.BytesIO()
    mx.save_safetensors(buffer, arrays, {_LAYERS: json.dumps(layers)})
    return buffer.getvalue()


def from_bytes(data: bytes) -> SavedState:
    """The cache, its tokens, images and jumps back from `to_bytes`, evaluated."""
    loaded = mx.load(io.BytesIO(data), format="safetensors", return_metadata=True)
    arrays, metadata = cast(tuple[dict[str, mx.array], dict[str, str]], loaded)
    mx.eval(list(arrays.values()))
    cache = [
        _KINDS[kind].from_state(_decode(state, arrays))
        for kind, state in json.loads(metadata[_LAYERS])
    ]
    tokens = cast(list[int], arrays.pop(_TOKENS).tolist())
    jumps, _ = Jumps.from_bytes(bytes(np.array(arrays.pop(_JUMPS))))
    media = {
        int(key.removeprefix(_MEDIA)): np.array(rows)
        for key, rows in arrays.items()
        if key.startswith(_MEDIA)
    }
    return SavedState(cache, tokens, media, jumps)


def trimmable(cache: list[Any]) -> bool:
    """Whether cutting tokens off the end leaves the cache as if they had never been seen."""
    # mlx-lm's ChunkedKVCache calls itself trimmable even after it dropped its front.
    return can_trim_prompt_cache(cache) and not any(
        getattr(layer, "start_position", 0) for layer in cache
    )
