"""One sequence's sampling on MLX, in llama-server's order, with a random key of its own."""

from __future__ import annotations

import math
import secrets
from collections.abc import Sequence
from typing import cast

import mlx.core as mx
from mlx_lm.sample_utils import (
    LogitsProcessor,
    apply_top_k,
    apply_top_p,
    make_logits_processors,
)

from mlxcel.backends.guidance import Constraint
from mlxcel.backends.mlx.dry import Dry
from mlxcel.engine.types import Sample, SamplingParams

# OpenAI's logit_bias of -100 means "never": make it so whatever the other logits are.
_BIAS_LIMIT = 100.0


def _log_softmax(logits: mx.array) -> mx.array:
    return logits - mx.logsumexp(logits, axis=-1, keepdims=True)


def _min_p(logprobs: mx.array, min_p: float) -> mx.array:
    """Keep the tokens at least `min_p` times as likely as the most likely one."""
    # Not mlx-lm's compiled apply_min_p: on a CPU it JIT-compiles a new kernel, for most of a
    # second, for every new min_p value a request brings.
    floor = mx.max(logprobs, axis=-1, keepdims=True) + math.log(min_p)
    return mx.where(logprobs < floor, -mx.inf, logprobs)


def _typical(logits: mx.array, mass: float) -> mx.array:
    """Locally typical sampling: keep the tokens nearest the entropy, `mass` of them."""
    logprobs = _log_softmax(logits)
    probs = mx.exp(logprobs)
    entropy = -mx.sum(mx.where(probs > 0, probs * logprobs, 0), axis=-1, keepdims=True)
    order = mx.argsort(mx.abs(-logprobs - entropy), axis=-1)
    cumulative = mx.cumsum(mx.take_along_axis(probs, order, axis=-1), axis=-1)
    keep = mx.sum(cumulative < mass, axis=-1, keepdims=True) + 1
    ranks = mx.argsort(order, axis=-1)
    return mx.where(ranks < keep, logits, -mx.inf)


def _xtc(logits: mx.array, threshold: float) -> mx.array:
    """Exclude top choices: drop every token above `threshold` but the least likely of them."""
    probs = mx.softmax(logits, axis=-1)
    above = probs >= threshold
    floor = mx.min(mx.where(above, probs, mx.inf), axis=-1, keepdims=True)
    drop = above & (probs > floor)
    return mx.where(drop, -mx.inf, logits)


def p_less(logits: mx.array, *, norm: bool) -> mx.array:
    """p-less (arXiv 2509.23234) on logits already at temperature: drop every token less likely
    than sum(p**2); p-less-norm: than (V * sum(p**2) - 1) / (V - 1), V the finite logits.

    The most likely token always stays.
    """
    probs = mx.softmax(logits, axis=-1)
    threshold = mx.sum(probs * probs, axis=-1, keepdims=True)
    if norm:
        n = mx.sum(logits > -mx.inf, axis=-1, keepdims=True).astype(mx.float32)
        threshold = mx.where(n > 1, (n * threshold - 1) / mx.maximum(n - 1, 1), 0)
    threshold = mx.minimum(threshold, mx.max(probs, axis=-1, keepdims=True))
    return mx.where(probs < threshold, -mx.inf, logits)


def _top_logprobs(logprobs: mx.array, n: int) -> tuple[tuple[int, float], ...]:
    best = mx.argpartition(-logprobs, kth=n - 1)[:n]
    values = logprobs[best]
    order = mx.argsort(-values)
    return tuple(
        zip(best[order].tolist(), values[order].tolist(), strict=True)  # type: ignore[arg-type]
    )


def _processors(params: SamplingParams) -> list[LogitsProcessor]:
    """mlx-lm's logit bias and penalties, over the last `repeat_last_n` generated tokens."""
    bias = {t: -mx.inf if b <= -_BIAS_LIMIT else b for t, b in params.logit_bias}
    # llama.cpp reads a window of 0 as "no penalties"; mlx-lm would read it as "all tokens".
    window = params.repeat_last_n
    return make_logits_processors(
        logit_bias=bias or None,
        repetition_penalty=params.repeat_penalty if window and params.repeat_penalty != 1 else None,
        repetition_context_size=window,
        presence_penalty=params.presence_penalty if window else None,
        presence_context_size=window,
        frequency_penalty=params.frequency_penalty if window else None,
        frequency_context_size=window,
    )


class SlotSampler:
    """Grammar, logit bias, penalties, DRY, then greedy or top-k/typical/top-p/min-p/XTC/temp,
    and p-less last before the draw."""

    def __init__(
        self,
        params: SamplingParams,
        *,
        n_vocab: int,
        end_of_generation: Sequence[int],
        dry: Dry | None,
        constraint: Constraint | None = None,
    ) -> None:
        self._params = params
        self._n_vocab = n_vocab
        self._dry = dry
        self._constraint = constraint
        self._end = end_of_generation[0] if end_of_generation else None
        self.generated: list[int] = []
        seed = secrets.randbits(64) if params.seed is None else params.seed % 2**64
        self._key = mx.random.key(seed)
        banned = (
            end_of_generation if params.ignore_eos else [*end_of_generation, *params.stop_token_ids]
        )
        self._banned = mx.array(sorted(set(banned))) if banned else None
        self._processors = _processors(params)

    def _banning(self) -> bool:
        params = self._params
        return params.ignore_eos or len(self.generated) < params.min_tokens

    def _constrain(self, logits: mx.array) -> mx.array:
        if self._constraint is None:
            return logits
        # The grammar's mask is worked out on the CPU while the forward pass runs.
        mx.async_eval(logits)
        return mx.where(mx.array(self._constraint.allowed()), logits, -mx.inf)

    def _process(self, logits: mx.array) -> mx.array:
        history = mx.array(self.generated, dtype=mx.int32)
        for processor in self._processors:
            logits = processor(history, logits)
        if self._banned is not None and self._banning():
            logits = logits.at[:, self._banned].add(-mx.inf)
        if self._dry is not None and self.generated:
            penalties = self._dry.penalties(self.generated)
            if penalties:
                ids = mx.array(list(penalties))
                logits = logits.at[:, ids].subtract(mx.array(list(penalties.values())))
        return logits

    def _choose(self, logits: mx.array) -> mx.array:
        params = self._params
        if params.temperature <= 0:
            return mx.argmax(logits, axis=-1)
        self._key, xtc_key, draw_key = mx.random.split(self._key, 3)
        logprobs = _log_softmax(logits)
        if 0 < params.top_k < self._n_vocab:
            logprobs = apply_top_k(logprobs, params.top_k)
        if params.typical_p < 1:
            logprobs = _typical(logprobs, params.typical_p)
        if params.top_p < 1:
            logprobs = apply_top_p(logprobs, params.top_p)
        if params.min_p > 0:
            logprobs = _min_p(logprobs, min(params.min_p, 1.0))
        if params.xtc_probability > 0 and params.xtc_threshold <= 0.5:
            chance = mx.random.uniform(key=xtc_key)
            logprobs = mx.where(
                chance < params.xtc_probability, _xtc(logprobs, params.xtc_threshold), logprobs
            )
        logits = logprobs * (1 / params.temperature)
        if params.p_less or params.p_less_norm:
            logits = p_less(logits, norm=params.p_less_norm)
        return mx.random.categorical(logits, key=draw_key)

    def choose(self, logits: mx.array) -> tuple[mx.array, mx.array | None]:
        """Lazily, the next token after raw logits ([vocab]) and, if asked for, their logprobs."""
        raw = logits.astype(mx.float32)[None]
        # The model's own log-probabilities, before any sampler reshapes them.
        logprobs = _log_softmax(raw)[0] if self._params.logprobs is not None else None
        if self._constraint is not None and self._constraint.finished and self._end is not None:
            # The grammar is complete: end here, whatever min_tokens or ignore_eos would ban.
            return mx.array(self._end), logprobs
        return self._choose(self._process(self._constrain(raw))), logprobs

    def accept(self, token: int, logprobs: mx.array | None) -> Sample:
        """Take `token` as chosen; `logprobs` are what `choose` gave with it, evaluated."""
        self.generated.append(token)
        if self._constraint is not None:
            self._constraint.advance(token)
        top_n = self._params.logprobs
        if top_n is None or logprobs is None:
            return Sample(token)
        top = _top_logprobs(logprobs, min(top_n, self._n_vocab)) if top_n > 0 else ()
        return Sample(token, cast(float, logprobs[token].item()), top)


def sample_rows(samplers: Sequence[SlotSampler], logits: mx.array) -> list[Sample]:
    """A token for each row of `logits` ([rows, vocab]) by that row's sampler, in one evaluation."""
    chosen = [sampler.choose(logits[row]) for row, sampler in enumerate(samplers)]
    mx.eval(chosen)
    return [
        sampler.accept(cast(int, choice.item()), logprobs)
        for sampler, (choice, logprobs) in zip(samplers, chosen, strict=True)
    ]
