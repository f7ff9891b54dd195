"""Scoring a prompt on MLX: the model's logits at every position, a chunk at a time.

The prompt runs through a fresh KV cache, not a slot's, so nothing another sequence holds is
touched; the slot it is scored for then takes that cache (it holds the prompt, which the
generation after it reuses). Each chunk's logits are `chunk` x vocabulary floats, turned into
log-probabilities and read before the next chunk runs, so a long prompt never holds
prompt x vocabulary of them at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from mlxcel.backends.mlx.batch import run
from mlxcel.engine.types import Sample

CHUNK = 128
"""Most prompt tokens per forward pass while scoring."""


def score_tokens(
    model: Any, tokens: Sequence[int], top_n: int, max_feed: int
) -> tuple[list[Any], list[Sample]]:
    """Evaluate `tokens` into a new KV cache, returned with each token after the first's
    log-probability after those before it and its `top_n` rivals, as the sampler reports a
    generated token's (the float32 log-softmax of the raw logits)."""
    cache = make_prompt_cache(model)
    chunk = max(1, min(CHUNK, max_feed))
    scores: list[Sample] = []
    for start in range(0, len(tokens), chunk):
        rows = list(tokens[start : start + chunk])
        logits = run(model, mx.array(rows)[None], cache)[0]
        # Row i's logits predict the token after it; the last token's predict none here.
        following = list(tokens[start + 1 : start + 1 + len(rows)])
        if not following:
            mx.eval([layer.state for layer in cache])
            continue
        raw = logits[: len(following)].astype(mx.float32)
        logprobs = raw - mx.logsumexp(raw, axis=-1, keepdims=True)
        chosen = mx.take_along_axis(logprobs, mx.array(following)[:, None], axis=-1)[:, 0]
        n = min(top_n, logprobs.shape[-1])
        best = mx.argpartition(-logprobs, kth=max(n - 1, 0), axis=-1)[:, :n]
        values = mx.take_along_axis(logprobs, best, axis=-1)
        order = mx.argsort(-values, axis=-1)
        best = mx.take_along_axis(best, order, axis=-1)
        values = mx.take_along_axis(values, order, axis=-1)
        mx.eval(chosen, best, values, [layer.state for layer in cache])
        ids = cast(list[list[int]], best.tolist())
        lps = cast(list[list[float]], values.tolist())
        own = cast(list[float], chosen.tolist())
        for i, token in enumerate(following):
            scores.append(Sample(token, own[i], tuple(zip(ids[i], lps[i], strict=True))))
    return cache, scores
