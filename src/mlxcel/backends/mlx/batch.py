"""The decoding slots' KV caches, and one forward pass over all their next tokens."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import Any, Protocol

import mlx.core as mx
import mlx.nn as nn


class DecodeRows(Protocol):
    """The KV caches of the slots that sample this step, each slot a row of the model's input.

    A slot's cache moves in with `join` and out with `leave`; between the two only `forward`
    touches it. Caches come back unevaluated: evaluate the ones to keep, drop the others free.
    """

    batched: bool
    """Whether `forward` is one pass of the model for every row."""

    @property
    def slots(self) -> list[int]:
        """The slots in row order."""
        ...

    def join(self, caches: Mapping[int, list[Any]]) -> None:
        """Add rows for these slots (slot -> its per-layer cache), after the existing ones."""
        ...

    def leave(self, slots: Collection[int]) -> dict[int, list[Any]]:
        """Remove these slots' rows; each slot's per-layer cache on its own."""
        ...

    def forward(
        self, model: nn.Module, tokens: list[int], positions: mx.array | None = None
    ) -> mx.array:
        """Logits ([rows, vocab]) after one token per row, in row order; `positions`: the
        rows' position ids ([3, rows, 1], M-RoPE), else the model counts them from the cache."""
        ...


class BatchedRows:
    """Every row in one batched KV cache (mlx-lm's BatchKVCache and kin): one forward pass.

    Rows of different lengths are left-padded and masked; a row that leaves is cut out of the
    batch, so the batch never computes a row nobody asked for. A lone row keeps a cache of its
    own: as a batch of one it would only pay for the padding mask.
    """

    batched = True

    def __init__(self) -> None:
        self._slots: list[int] = []
        self._cache: list[Any] = []

    @property
    def slots(self) -> list[int]:
        return self._slots

    def join(self, caches: Mapping[int, list[Any]]) -> None:
        if not caches:
            return
        if len(self._slots) > 1:
            for mine, theirs in zip(self._cache, _merge(caches.values()), strict=True):
                mine.extend(theirs)
        else:
            rows = [self._cache] if self._slots else []
            rows += caches.values()
            self._cache = rows[0] if len(rows) == 1 else _merge(rows)
        self._slots = [*self._slots, *caches]

    def leave(self, slots: Collection[int]) -> dict[int, list[Any]]:
        rows = {slot: self._slots.index(slot) for slot in slots}
        if not rows:
            return {}
        keep = [row for row, slot in enumerate(self._slots) if slot not in rows]
        if len(self._slots) == 1:
            out = {self._slots[0]: self._cache}
        else:
            out = {slot: self._row(row) for slot, row in rows.items()}
            if len(keep) == 1:
                self._cache = self._row(keep[0])
            elif keep:
                for layer in self._cache:
                    layer.filter(keep)
        if not keep:
            self._cache = []
        self._slots = [self._slots[row] for row in keep]
        return out

    def _row(self, row: int) -> list[Any]:
        return [layer.extract(row) for layer in self._cache]

    def forward(
        self, model: nn.Module, tokens: list[int], positions: mx.array | None = None
    ) -> mx.array:
        return run(model, mx.array(tokens)[:, None], self._cache, positions)[:, -1]


def _merge(caches: Iterable[list[Any]]) -> list[Any]:
    """Per-layer caches of several sequences merged, layer by layer, into batch caches."""
    return [type(layers[0]).merge(list(layers)) for layers in zip(*caches, strict=True)]


class SingleRows:
    """Each row through the model on its own: for caches mlx-lm cannot batch."""

    batched = False

    def __init__(self) -> None:
        self._caches: dict[int, list[Any]] = {}

    @property
    def slots(self) -> list[int]:
        return list(self._caches)

    def join(self, caches: Mapping[int, list[Any]]) -> None:
        self._caches.update(caches)

    def leave(self, slots: Collection[int]) -> dict[int, list[Any]]:
        return {slot: self._caches.pop(slot) for slot in slots}

    def forward(
        self, model: nn.Module, tokens: list[int], positions: mx.array | None = None
    ) -> mx.array:
        rows = [
            run(model, mx.array([[token]]), cache, None if positions is None else positions[:, [i]])
            for i, (token, cache) in enumerate(zip(tokens, self._caches.values(), strict=True))
        ]
        return mx.concatenate([row[:, -1] for row in rows])


def run(
    model: nn.Module,
    inputs: mx.array,
    cache: list[Any],
    positions: mx.array | None = None,
    embedded: Mapping[str, Any] | None = None,
) -> mx.array:
    """The model's logits for `inputs` ([rows, tokens]) over `cache`; position ids and the
    inputs of embedded tokens (input embeddings, a vision model's `embed`) passed only where
    given (mlx-lm's text models take neither)."""
    extra: dict[str, Any] = dict(embedded or {})
    if positions is not None:
        extra["position_ids"] = positions
    logits: mx.array = model(inputs, cache=cache, **extra)
    return logits


def unbatchable(cache: list[Any]) -> list[str]:
    """The cache types among a model's layers that mlx-lm cannot merge into a batch."""
    return sorted({type(layer).__name__ for layer in cache if not hasattr(layer, "merge")})
