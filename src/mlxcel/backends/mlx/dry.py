"""DRY ("don't repeat yourself"): penalise the tokens that would extend a repeat of earlier text."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

# A float32 overflows past exp(88.7): the penalty's exponent is capped below that.
_MAX_LOG_FLOAT32 = 88.7


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
