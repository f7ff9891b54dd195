"""Speculative decoding by prompt lookup: drafts copied from earlier in a sequence's own tokens.

When the last `size_n` tokens of a sequence (prompt and output so far) occurred before, the
tokens that followed them then are proposed as the next ones (llama-server's `ngram-simple`).
The engine evaluates the sequence's last token and the draft in one forward pass and samples
at each position in order, keeping draft tokens while they equal what was sampled there.

Why this is exact: a draft is a function of the tokens so far, so the draft distribution q is
a point mass on the draft token d. The standard speculative rule accepts d with probability
min(1, p(d) / q(d)) = p(d) and otherwise samples from max(0, p - q) renormalised, which is p
without d. Sampling t ~ p and accepting when t == d does exactly that: P(accept) = p(d), and a
rejected draft leaves t distributed as p given t != d. So every token comes from the same
distribution (the same sampler chain, at the same state) as without speculation, and under
greedy decoding it is the same token.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

# Tokens in a sequence's first draft, before its acceptance is known.
FIRST_DRAFT = 8


@dataclass(frozen=True)
class SpeculativeConfig:
    """How drafts are made: the n-gram looked up, the most tokens drafted, the fewest worth
    verifying."""

    size_n: int
    size_m: int
    n_min: int = 0


class NgramDrafter:
    """One sequence's tokens, and where each n-gram of them last ended.

    The index lags one token behind the sequence, so the n-gram ending at the last token (the
    one looked up) is never found as its own match. The draft length adapts, since on a CPU
    every drafted token costs the pass about what a prompt token costs: it starts at
    FIRST_DRAFT, a draft taken whole doubles it (up to `size_m`), one rejected at its first
    token halves it, and one taken in part sets it to what was taken.
    """

    def __init__(self, config: SpeculativeConfig, tokens: Iterable[int] = ()) -> None:
        self._config = config
        self._tokens: list[int] = []
        self._ends: dict[tuple[int, ...], int] = {}
        self._length = min(config.size_m, FIRST_DRAFT)
        self.extend(tokens)

    def extend(self, tokens: Iterable[int]) -> None:
        """Tokens appended to the sequence."""
        n = self._config.size_n
        for token in tokens:
            self._tokens.append(token)
            end = len(self._tokens) - 1
            if end >= n:
                self._ends[tuple(self._tokens[end - n : end])] = end

    def propose(self, limit: int) -> tuple[int, ...]:
        """Up to `limit` tokens to verify after the last one; () when nothing matches."""
        n, tokens = self._config.size_n, self._tokens
        if len(tokens) <= n:
            return ()
        end = self._ends.get(tuple(tokens[-n:]))
        if end is None:
            return ()
        draft = tuple(tokens[end : end + min(limit, self._length)])
        return draft if len(draft) >= max(1, self._config.n_min) else ()

    def record(self, drafted: int, accepted: int) -> None:
        """How the last draft fared, to size the next."""
        if accepted == drafted:
            self._length = min(self._config.size_m, 2 * self._length)
        elif accepted == 0:
            self._length = max(1, self._length // 2)
        else:
            self._length = accepted
