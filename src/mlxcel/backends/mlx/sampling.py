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
from mlxcel.backends.mlx.mirostat import Mirostat
from mlxcel.engine.types import Sample, SamplerStage, SamplingParams

# OpenAI's logit_bias of -100 means "never": make it so whatever the other logits are.
_BIAS_LIMIT = 100.0


def _log_softmax(logits: mx.array) -> mx.array:
    return logits - mx.logsumexp(logits, axis=-1, keepdims=True)


def _top_p(logits: mx.array, top_p: float) -> mx.array:
    """Keep the most likely tokens that together reach `top_p` (0: the most likely only)."""
    logprobs = _log_softmax(logits)
    if top_p <= 0:
        return mx.where(logprobs < mx.max(logprobs, axis=-1, keepdims=True), -mx.inf, logits)
    return mx.where(apply_top_p(logprobs, top_p) == -mx.inf, -mx.inf, logits)


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


def _bias(params: SamplingParams) -> list[LogitsProcessor]:
    """mlx-lm's logit bias."""
    bias = {t: -mx.inf if b <= -_BIAS_LIMIT else b for t, b in params.logit_bias}
    return make_logits_processors(logit_bias=bias or None)


def _penalties(params: SamplingParams) -> list[LogitsProcessor]:
    """mlx-lm's penalties, over the last `repeat_last_n` generated tokens."""
    # llama.cpp reads a window of 0 as "no penalties"; mlx-lm would read it as "all tokens".
    window = params.repeat_last_n
    return make_logits_processors(
        repetition_penalty=params.repeat_penalty if window and params.repeat_penalty != 1 else None,
        repetition_context_size=window,
        presence_penalty=params.presence_penalty if window else None,
        presence_context_size=window,
        frequency_penalty=params.frequency_penalty if window else None,
        frequency_context_size=window,
    )


# With temperature <= 0 the most likely token is taken: only these stages can change which.
_GREEDY_STAGES = ("penalties", "dry")


class SlotSampler:
    """Grammar, logit bias, then the `samplers` stages in order (penalties, DRY, top-k, typical,
    top-p, min-p, XTC, temperature by default) and a draw; greedy at temperature <= 0, and
    Mirostat after temperature alone when asked for, as llama-server's chain does; p-less
    last before the draw."""

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
        self._banned_ids = tuple(sorted(set(banned)))
        self._banned = mx.array(self._banned_ids) if banned else None
        self._bias = _bias(params)
        self._penalties = _penalties(params)
        self._mirostat = (
            Mirostat(params.mirostat, params.mirostat_tau, params.mirostat_eta, n_vocab)
            if params.mirostat and params.temperature > 0
            else None
        )

    def batch_key(self) -> tuple[object, ...] | None:
        """What this step's pick depends on besides the row's logits and random key, when it
        is the chain's stages over the raw logits less the banned ids (end tokens, under
        min_tokens or ignore_eos), then the draw: rows with equal keys are picked together
        by `sample_rows`. None when anything else comes between: a grammar, bias, penalties,
        DRY, XTC, Mirostat or logprobs."""
        params = self._params
        if (
            params.logprobs is not None
            or self._constraint is not None
            or self._bias
            or self._penalties
            or self._dry is not None
            or self._mirostat is not None
            or (params.xtc_probability > 0 and params.xtc_threshold <= 0.5)
        ):
            return None
        banned = self._banned_ids if self._banning() else ()
        if params.temperature <= 0:
            return ("greedy", banned)
        chain = (params.samplers, params.top_k, params.typical_p, params.top_p, params.min_p)
        return ("draw", banned, *chain, params.temperature, params.p_less, params.p_less_norm)

    def draw_key(self) -> mx.array:
        """The key of this step's draw, the row's key moving on as `_choose` moves it."""
        self._key, _, draw_key = mx.random.split(self._key, 3)
        return draw_key

    def chain(self, logits: mx.array, xtc_key: mx.array | None = None) -> mx.array:
        """The `samplers` stages in order (temperature alone before Mirostat) over (masked)
        raw logits ([rows, vocab]), then p-less: what the draw is made from."""
        stages = ("temperature",) if self._mirostat is not None else self._params.samplers
        for stage in stages:
            logits = self._stage(stage, logits, xtc_key)
        if self._params.p_less or self._params.p_less_norm:
            logits = p_less(logits, norm=self._params.p_less_norm)
        return logits

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
        for processor in self._bias:
            logits = processor(history, logits)
        if self._banned is not None and self._banning():
            logits = logits.at[:, self._banned].add(-mx.inf)
        return logits

    def _stage(self, stage: SamplerStage, logits: mx.array, xtc_key: mx.array | None) -> mx.array:
        """One stage of the chain over (masked) raw logits; a stage its setting leaves off
        returns them as they are."""
        params = self._params
        if stage == "penalties":
            history = mx.array(self.generated, dtype=mx.int32)
            for processor in self._penalties:
                logits = processor(history, logits)
        elif stage == "dry" and self._dry is not None and self.generated:
            penalties = self._dry.penalties(self.generated)
            if penalties:
                ids = mx.array(list(penalties))
                logits = logits.at[:, ids].subtract(mx.array(list(penalties.values())))
        elif stage == "top_k" and 0 < params.top_k < self._n_vocab:
            logits = apply_top_k(logits, params.top_k)
        elif stage == "typ_p" and params.typical_p < 1:
            logits = _typical(logits, params.typical_p)
        elif stage == "top_p" and params.top_p < 1:
            logits = _top_p(logits, params.top_p)
        elif stage == "min_p" and params.min_p > 0:
            logits = _min_p(logits, min(params.min_p, 1.0))
        elif stage == "xtc" and params.xtc_probability > 0 and params.xtc_threshold <= 0.5:
            chance = mx.random.uniform(key=xtc_key)
            logits = mx.where(
                chance < params.xtc_probability, _xtc(logits, params.xtc_threshold), logits
            )
        elif stage == "temperature":
            logits = logits * (1 / params.temperature)
        return logits

    def _choose(self, logits: mx.array) -> tuple[mx.array, mx.array]:
        """The token, and the logits the chain left to draw it from (lazy: evaluated only for
        post-sampling probabilities); a greedy pick's leave only the token."""
        params = self._params
        if params.temperature <= 0:
            for stage in params.samplers if not params.mirostat else ():
                if stage in _GREEDY_STAGES:
                    logits = self._stage(stage, logits, self._key)
            token = mx.argmax(logits, axis=-1)
            only = mx.arange(logits.shape[-1]) == token[:, None]
            return token, mx.where(only, 0.0, -mx.inf)
        self._key, xtc_key, draw_key = mx.random.split(self._key, 3)
        logits = self.chain(logits, xtc_key)
        if self._mirostat is not None:
            return self._mirostat.choose(logits, draw_key), logits
        return draw(logits, [draw_key]), logits

    def choose(self, logits: mx.array) -> tuple[mx.array, mx.array | None]:
        """Lazily, the next token after raw logits ([vocab]) and, if asked for, their logprobs."""
        raw = logits.astype(mx.float32)[None]
        wanted = self._params.logprobs is not None
        # The model's own log-probabilities, before any sampler reshapes them.
        logprobs = _log_softmax(raw)[0] if wanted else None
        if self._constraint is not None and self._constraint.finished and self._end is not None:
            # The grammar is complete: end here, whatever min_tokens or ignore_eos would ban.
            return mx.array(self._end), logprobs
        token, left = self._choose(self._process(self._constrain(raw)))
        if wanted and self._params.post_sampling_probs:
            # Those the chain left: dropped candidates have -inf, so probability 0.
            logprobs = _log_softmax(left)[0]
        return token, logprobs

    def accept(self, token: int, logprobs: mx.array | None) -> Sample:
        """Take `token` as chosen; `logprobs` are what `choose` gave with it, evaluated."""
        self.generated.append(token)
        if self._constraint is not None:
            self._constraint.advance(token)
        if self._mirostat is not None:
            self._mirostat.accept(token)
        top_n = self._params.logprobs
        if top_n is None or logprobs is None:
            return Sample(token)
        top = _top_logprobs(logprobs, min(top_n, self._n_vocab)) if top_n > 0 else ()
        if self._params.post_sampling_probs:
            # What the chain dropped is not listed (llama-server lists no 0 probabilities).
            top = tuple((t, lp) for t, lp in top if lp > -math.inf)
        return Sample(token, cast(float, logprobs[token].item()), top)


def draw(logits: mx.array, keys: Sequence[mx.array]) -> mx.array:
    """A token from each row of `logits` ([rows, vocab]) by its softmax, with that row's key
    (the Gumbel-max trick: the same draw whatever rows are drawn beside it)."""
    vocab = logits.shape[-1]
    noise = [mx.random.gumbel(shape=(1, vocab), key=key) for key in keys]
    return mx.argmax(logits + (noise[0] if len(noise) == 1 else mx.concatenate(noise)), axis=-1)


def sample_rows(samplers: Sequence[SlotSampler], logits: mx.array) -> list[Sample]:
    """A token for each row of `logits` ([rows, vocab]) by that row's sampler, in one evaluation.

    Rows whose samplers give the same `batch_key` take theirs together, each stage once over
    their rows and the draw with each row's own key: the same picks, without a chain of small
    operations a row (issue 39: on a small model they cost a sixth of a step of eight rows).
    """
    groups: dict[tuple[object, ...], list[int]] = {}
    chosen: dict[int, tuple[mx.array, mx.array | None]] = {}
    for row, sampler in enumerate(samplers):
        key = sampler.batch_key()
        if key is None:
            chosen[row] = sampler.choose(logits[row])
        else:
            groups.setdefault(key, []).append(row)
    picks = {
        key: _pick_rows(logits, rows, key, [samplers[row] for row in rows])
        for key, rows in groups.items()
    }
    mx.eval(list(chosen.values()), list(picks.values()))
    tokens: dict[int, int] = {}
    for key, rows in groups.items():
        tokens.update(zip(rows, cast(list[int], picks[key].tolist()), strict=True))
    for row, (choice, _) in chosen.items():
        tokens[row] = cast(int, choice.item())
    return [
        sampler.accept(tokens[row], chosen[row][1] if row in chosen else None)
        for row, sampler in enumerate(samplers)
    ]


def _pick_rows(
    logits: mx.array, rows: list[int], key: tuple[object, ...], samplers: list[SlotSampler]
) -> mx.array:
    """The tokens of these rows of `logits`, whose samplers share `key`."""
    block = logits if len(rows) == logits.shape[0] else logits[mx.array(rows)]
    block = block.astype(mx.float32)
    banned = cast(tuple[int, ...], key[1])
    if banned:
        block = block.at[:, mx.array(banned)].add(-mx.inf)
    if key[0] == "greedy":
        return mx.argmax(block, axis=-1)
    return draw(samplers[0].chain(block), [sampler.draw_key() for sampler in samplers])
