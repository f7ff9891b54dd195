"""DRY ("don't repeat yourself"): penalise the tokens that would extend a repeat of earlier text."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from mlxcel.engine.types import SamplingParams

# A float32 overflows past exp(88.7): the penalty's exponent is capped below that.
_MAX_LOG_FLOAT32 = 88.7
# Each request may bring its own DRY breakers; their token sets are cached, but not forever.
_MAX_BREAKER_SETS = 16


def _z_array(seq: Sequence[int]) -> list[int]:
    """z[k]: how many items from position k on agree with the start of `seq` (Z-algorithm)."""
    n = len(seq)
    z = [0] * n
    left = right = 0
    for k in range(1, n):
        if k < right:
            z[k] = min(right - k, z[k - left])
        while k + z[k] < n and seq[z[k]] == seq[k + z[k]]:
            z[k] += 1
        if k + z[k] > right:
            left, right = k, k + z[k]
    return z


@dataclass(frozen=True)
class Dry:
    """llama.cpp's DRY over the tokens generated so far; a breaker token ends any repeat."""

    multiplier: float
    base: float
    allowed_length: int
    last_n: int
    breakers: frozenset[int]

    def penalties(self, tokens: Sequence[int]) -> dict[int, float]:
        """token -> amount to subtract from its logit."""
        window = list(tokens[-self.last_n :])
        tail = 0
        while tail < len(window) and window[-1 - tail] not in self.breakers:
            tail += 1
        if tail < self.allowed_length:
            return {}
        # On the reversed window, z[k] is how far the text before the token at len-k
        # repeats the text at the end: that token would extend a repeat of this length.
        reversed_z = _z_array(window[::-1])
        longest: dict[int, int] = {}
        for k in range(1, len(window)):
            length = min(reversed_z[k], tail)
            candidate = window[-k]
            if length >= self.allowed_length and length > longest.get(candidate, 0):
                longest[candidate] = length
        cap = _MAX_LOG_FLOAT32 / math.log(self.base) if self.base > 1 else math.inf
        return {
            token: self.multiplier * self.base ** min(length - self.allowed_length, cap)
            for token, length in longest.items()
        }


class DrySettings:
    """Each request's `Dry` (None where its DRY is off), the token sets of its breakers cached
    per set of strings; `tokens_containing`: the vocabulary's tokens holding any of them."""

    def __init__(self, tokens_containing: Callable[[tuple[str, ...]], frozenset[int]]) -> None:
        self._tokens_containing = tokens_containing
        self._breakers: dict[tuple[str, ...], frozenset[int]] = {}

    def for_request(self, params: SamplingParams, n_ctx_seq: int) -> Dry | None:
        if params.dry_multiplier <= 0 or params.dry_penalty_last_n == 0:
            return None
        breakers = params.dry_sequence_breakers
        if breakers not in self._breakers:
            if len(self._breakers) >= _MAX_BREAKER_SETS:
                self._breakers.clear()
            self._breakers[breakers] = self._tokens_containing(breakers)
        last_n = n_ctx_seq if params.dry_penalty_last_n < 0 else params.dry_penalty_last_n
        return Dry(
            params.dry_multiplier,
            params.dry_base,
            params.dry_allowed_length,
            last_n,
            self._breakers[breakers],
        )
