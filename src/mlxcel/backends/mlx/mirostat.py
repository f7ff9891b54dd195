"""Mirostat 1 and 2 as llama.cpp runs them: keep each token's surprise near a target.

Each step keeps the tokens the running bound `mu` allows, samples among them, and moves `mu`
by the learning rate times how far the sampled token's surprise (bits) missed the target tau.
Version 2 keeps the tokens whose surprise is at most `mu`; version 1 estimates the Zipf
exponent of the 100 most likely tokens and keeps the top k that it says reach `mu`.
"""

from __future__ import annotations

import math
from typing import cast

import mlx.core as mx

# Mirostat 1 fits the Zipf exponent on this many of the most likely tokens (llama.cpp's m).
_ZIPF_TOKENS = 100


def _log_softmax(logits: mx.array) -> mx.array:
    return logits - mx.logsumexp(logits, axis=-1, keepdims=True)


class Mirostat:
    """One sequence's Mirostat state; `logits` come already divided by the temperature."""

    def __init__(self, version: int, tau: float, eta: float, n_vocab: int) -> None:
        self._version = version
        self._tau = tau
        self._eta = eta
        self._n_vocab = n_vocab
        self._mu = 2 * tau
        self._kept: mx.array | None = None

    def _top_k(self, logprobs: mx.array) -> mx.array:
        """Mirostat 1's k, from the Zipf exponent of the most likely tokens."""
        ranked = -mx.sort(-logprobs, axis=-1)
        m = min(_ZIPF_TOKENS, ranked.shape[-1])
        i = mx.arange(m - 1, dtype=mx.float32)
        t = mx.log((i + 2) / (i + 1))
        b = ranked[..., : m - 1] - ranked[..., 1:m]
        s_hat = mx.sum(t * b, axis=-1, keepdims=True) / mx.sum(t * t)
        epsilon = s_hat - 1
        k = ((epsilon * 2**self._mu) / (1 - self._n_vocab ** (-epsilon))) ** (1 / s_hat)
        k = mx.clip(mx.nan_to_num(k, nan=1.0, posinf=float(self._n_vocab)), 1, self._n_vocab)
        kth = mx.take_along_axis(ranked, k.astype(mx.int32) - 1, axis=-1)
        return logprobs >= kth

    def choose(self, logits: mx.array, key: mx.array) -> mx.array:
        """Lazily, the next token among those `mu` allows (logits: [1, vocab])."""
        logprobs = _log_softmax(logits)
        if self._version == 1:
            keep = self._top_k(logprobs)
        else:
            best = mx.max(logprobs, axis=-1, keepdims=True)
            keep = (-logprobs / math.log(2) <= self._mu) | (logprobs >= best)
        self._kept = _log_softmax(mx.where(keep, logprobs, -mx.inf))
        return mx.random.categorical(self._kept, key=key)

    def accept(self, token: int) -> None:
        """Move `mu` by how surprising the chosen token was among the kept ones."""
        if self._kept is None:
            return
        surprise = -cast(float, self._kept[0, token].item()) / math.log(2)
        self._mu -= self._eta * (surprise - self._tau)
        self._kept = None
