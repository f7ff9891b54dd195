"""Scoring a prompt on llama.cpp: every position's logits, a chunk of the prompt at a time.

The prompt goes into the free slot's own KV sequence, so the other slots' sequences, which
may be decoding between two of these steps, are untouched. Each decode asks for the logits of
every row, `CHUNK` rows at a time: llama.cpp's CPU backend computes a batch of 64 rows or
more with other kernels than a decode step's (measured on SmolLM2's Q4_1: a batch of 63 rows
gives the log-probabilities one-token decodes give, to the last bit; one of 64 gives them up
to 0.4 apart), so a prompt token is scored as it is when generated. Its output buffer (rows x
vocabulary floats, grown to the largest batch asked for and kept) stays small too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mlxcel.backends.llamacpp import drafting, native
from mlxcel.backends.llamacpp.sampling import sample_with_logprobs
from mlxcel.engine.types import Sample

CHUNK = 32
"""Rows per decode while scoring (each with its logits)."""

_memory_seq_rm = native.holding_gil("llama_memory_seq_rm")


def score_into(
    ctx: Any,
    memory: Any,
    batch: Any,
    n_batch: int,
    slot: int,
    tokens: Sequence[int],
    top_n: int,
    n_vocab: int,
) -> list[Sample]:
    """Evaluate `tokens` from position 0 into sequence `slot` (what it held is dropped) and
    give each token after the first its log-probability after those before it, with its
    `top_n` rivals, as the sampler reports a generated token's."""
    _memory_seq_rm(memory, slot, -1, -1)
    chunk = min(CHUNK, n_batch)
    scores: list[Sample] = []
    for start in range(0, len(tokens), chunk):
        rows = tokens[start : start + chunk]
        for i, token in enumerate(rows):
            native.put_token(batch, i, token, start + i, slot, True)
        drafting.decode(ctx, batch, len(rows))
        # Row i's logits predict the token after it; the last token's predict none here.
        following = tokens[start + 1 : start + 1 + len(rows)]
        scores.extend(
            sample_with_logprobs(ctx, i, n_vocab, token, top_n) for i, token in enumerate(following)
        )
    return scores
