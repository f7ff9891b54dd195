"""Speculative decoding: drafts verified in the step's one forward pass, and how long they are.

Drafts come from prompt lookup (NgramDrafter: when the last `size_n` tokens of a sequence,
prompt and output so far, occurred before, the tokens that followed them then; llama-server's
`ngram-simple`) or from a draft model (the generator's, greedy). The engine evaluates the
sequence's last token and the draft in one forward pass and samples at each position in order,
keeping draft tokens while they equal what was sampled there.

Why this is exact: a draft is a function of the tokens so far, so the draft distribution q is
a point mass on the draft token d. The standard speculative rule accepts d with probability
min(1, p(d) / q(d)) = p(d) and otherwise samples from max(0, p - q) renormalised, which is p
without d. Sampling t ~ p and accepting when t == d does exactly that: P(accept) = p(d), and a
rejected draft leaves t distributed as p given t != d. So every token comes from the same
distribution (the same sampler chain, at the same state) as without speculation, and under
greedy decoding it is the same token. A greedy draft model's draft is such a function too.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

# The acceptance a sequence starts with, as pseudo-counts: what it takes to draft at once
# where drafted tokens cost little to verify, and to wait for evidence where they cost much.
PRIOR_ACCEPTED = 3.0
PRIOR_REJECTED = 1.0
# How much of the acceptance seen so far a new draft's outcome leaves (recent drafts weigh
# more: a copied stretch starts and ends).
DECAY = 0.8
# Tokens of a lookup that is checked against what is generated instead of being verified.
SHADOW_TOKENS = 8
# The n-gram looked up where the --spec-ngram-simple-size-n one is found nowhere: after an
# edit the output takes that many tokens to match the input again, a short one fewer.
FALLBACK_N = 4


# The draft lengths whose verification the loader times: a decode of 1 + d tokens. Widths that
# are multiples of 4 and 8 cost much less per token than their neighbours on llama.cpp's CPU
# kernels (Qwen2.5-Coder-0.5B Q4_K_M, one AVX-512 core: 8 tokens 6.2 one-token decodes, 9
# tokens 8.2, 16 tokens 7.8); drafts are only made at a length that was timed.
DRAFT_LENGTHS = (1, 3, 7, 11, 15, 23, 31)

DraftCosts = tuple[tuple[int, float], ...]
"""(d, what verifying d drafted tokens costs: the decode of the last token and the draft, as a
multiple of a one-token decode), by d increasing: the lengths drafts are made at."""


def timed_lengths(size_m: int) -> list[int]:
    """The draft lengths to time for drafts of at most `size_m` tokens."""
    return [d for d in DRAFT_LENGTHS if d < size_m] + [size_m]


def linear_costs(token_cost: float, size_m: int) -> DraftCosts:
    """Every length up to `size_m`, each drafted token adding `token_cost` of a decode."""
    return tuple((d, 1.0 + token_cost * d) for d in range(1, size_m + 1))


@dataclass(frozen=True)
class SpeculativeConfig:
    """How drafts are made: the n-gram looked up, the most tokens drafted, what verifying a
    draft costs at each length drafts are made at, and the fewest worth verifying."""

    size_n: int
    size_m: int
    costs: DraftCosts
    n_min: int = 0


def longest_timed(config: SpeculativeConfig, most: int) -> int:
    """The longest length drafts are made at, up to `most`; 0 where that is none or shorter
    than draft-min (a wider decode can cost more than the timed one below it)."""
    kept = max((d for d, _ in config.costs if d <= most), default=0)
    return kept if kept >= max(1, config.n_min) else 0


class DraftSizer:
    """The length of a sequence's next draft: the one expected to give the most tokens per
    unit of decode time, from its acceptance so far and the cost of a drafted token.

    Each drafted token is taken, given the ones before it were, with a probability p estimated
    from the sequence's drafts (decayed counts of tokens taken and of drafts cut short). A draft
    of d tokens then yields 1 + p + ... + p^d tokens for its cost (SpeculativeConfig.costs) in
    one-token decodes; a length of 0 (no draft, one token for one decode) wins unless a draft
    beats it.
    """

    def __init__(self, config: SpeculativeConfig) -> None:
        self._config = config
        self._accepted = PRIOR_ACCEPTED
        self._rejected = PRIOR_REJECTED

    @property
    def acceptance(self) -> float:
        """The estimated chance that a drafted token is taken after the ones before it."""
        return self._accepted / (self._accepted + self._rejected)

    def length(self, limit: int) -> int:
        """How many tokens to draft, at most `limit`; 0 for none."""
        p, fewest = self.acceptance, max(1, self._config.n_min)
        best, best_rate, gain, term, summed = 0, 1.0, 0.0, 1.0, 0
        for d, cost in self._config.costs:
            if d > limit:
                break
            for _ in range(summed, d):
                term *= p
                gain += term
            summed = d
            rate = (1 + gain) / cost
            if d >= fewest and rate > best_rate:
                best, best_rate = d, rate
            if term < 1e-3:
                break
        return best

    def record(self, drafted: int, accepted: int) -> None:
        """How a draft fared (verified, or checked against what was generated)."""
        self._accepted = DECAY * self._accepted + accepted
        self._rejected = DECAY * self._rejected + (accepted < drafted)


class Drafter:
    """One sequence's tokens (prompt and output so far) and its draft sizing: what a draft
    model drafts from."""

    def __init__(self, config: SpeculativeConfig, tokens: Iterable[int] = ()) -> None:
        self._config = config
        self.tokens: list[int] = []
        self.sizer = DraftSizer(config)
        self.extend(tokens)

    def extend(self, tokens: Iterable[int]) -> None:
        """Tokens appended to the sequence."""
        self.tokens.extend(tokens)

    def record(self, drafted: int, accepted: int) -> None:
        """How the last draft fared, to size the next."""
        self.sizer.record(drafted, accepted)


class NgramDrafter(Drafter):
    """A sequence's prompt-lookup drafts: where each n-gram of its tokens last ended.

    The index lags one token behind the sequence, so the n-gram ending at the last token (the
    one looked up) is never found as its own match. A match is then followed: while the tokens
    generated go on equalling those after it, the next draft continues from there instead of
    looking up again. Code repeats itself, and the latest occurrence of a short stretch is
    often another copy than the one being followed (the previous function's, just written);
    following the copy drafts the rest of it (on Qwen2.5-Coder-0.5B copying ten similar
    functions, all of 223 drafted tokens taken against 210 of 270 looking up each time). A
    lookup not worth verifying at the sequence's acceptance so far is checked against the
    tokens generated next instead (a shadow draft, free), so the acceptance keeps up when
    drafting pauses. Where the n-gram is found nowhere, a FALLBACK_N-gram is looked up.
    """

    def __init__(self, config: SpeculativeConfig, tokens: Iterable[int] = ()) -> None:
        # For each n looked up, longest first: where each n-gram last ended.
        sizes = sorted({config.size_n, min(config.size_n, FALLBACK_N)}, reverse=True)
        self._ends: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in sizes}
        # Where the copy being followed goes on: the token there is the next one's draft.
        self._source: int | None = None
        self._shadow: tuple[int, ...] = ()
        self._shadow_matched = 0
        super().__init__(config, tokens)

    def extend(self, tokens: Iterable[int]) -> None:
        """Tokens appended to the sequence."""
        for token in tokens:
            self._check_shadow(token)
            source = self._source
            if source is not None:
                self._source = source + 1 if self.tokens[source] == token else None
            self.tokens.append(token)
            end = len(self.tokens) - 1
            for n, ends in self._ends.items():
                if end >= n:
                    ends[tuple(self.tokens[end - n : end])] = end

    def _check_shadow(self, token: int) -> None:
        shadow = self._shadow
        if not shadow:
            return
        if token == shadow[self._shadow_matched]:
            self._shadow_matched += 1
            if self._shadow_matched < len(shadow):
                return
        self.sizer.record(len(shadow), self._shadow_matched)
        self._shadow, self._shadow_matched = (), 0

    def _lookup(self, limit: int) -> tuple[int, ...]:
        tokens = self.tokens
        for n, ends in self._ends.items():
            if self._source is None and len(tokens) > n:
                self._source = ends.get(tuple(tokens[-n:]))
        source = self._source
        return () if source is None else tuple(tokens[source : source + limit])

    def propose(self, limit: int) -> tuple[int, ...]:
        """Up to `limit` tokens to verify after the last one; () when nothing matches or a
        draft is not worth its cost."""
        if self._shadow:
            return ()
        found = self._lookup(min(limit, self._config.size_m))
        if not found:
            return ()
        draft = found[: self.sizer.length(len(found))]
        if not draft:
            self._shadow = found[:SHADOW_TOKENS]
        return draft
