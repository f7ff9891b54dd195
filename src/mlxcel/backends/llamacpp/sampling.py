"""Per-request llama.cpp sampler chains, and log-probabilities read from the logits."""

from __future__ import annotations

import ctypes
import math
from collections.abc import Iterable
from typing import Any

import llama_cpp
import numpy as np

from mlxcel.backends.guidance import held_by_guidance
from mlxcel.engine.types import EngineError, Sample, SamplerStage, SamplingParams

# OpenAI's logit_bias of -100/100 means "never"/"always"; llama.cpp wants infinities for that.
_BIAS_LIMIT = 100.0


def _bias_value(bias: float) -> float:
    if bias <= -_BIAS_LIMIT:
        return -math.inf
    return math.inf if bias >= _BIAS_LIMIT else bias


def _logit_bias(n_vocab: int, biases: Iterable[tuple[int, float]]) -> Any:
    items = [llama_cpp.llama_logit_bias(token, _bias_value(bias)) for token, bias in biases]
    array = (llama_cpp.llama_logit_bias * len(items))(*items)
    return llama_cpp.llama_sampler_init_logit_bias(n_vocab, len(items), array)


def _penalties(params: SamplingParams) -> Any:
    # The binding still declares a leading n_vocab that the C function no longer takes;
    # integers and floats travel in separate registers, so passing the window size in
    # both integer slots gives the C side the right value either way.
    return llama_cpp.llama_sampler_init_penalties(
        params.repeat_last_n,
        params.repeat_last_n,
        params.repeat_penalty,
        params.frequency_penalty,
        params.presence_penalty,
    )


def _dry(vocab: Any, params: SamplingParams, n_ctx: int) -> Any:
    breakers = [b.encode() for b in params.dry_sequence_breakers]
    array = (ctypes.c_char_p * max(1, len(breakers)))(*breakers)
    last_n = n_ctx if params.dry_penalty_last_n == -1 else params.dry_penalty_last_n
    return llama_cpp.llama_sampler_init_dry(
        vocab,
        params.dry_multiplier,
        params.dry_base,
        params.dry_allowed_length,
        last_n,
        array,
        len(breakers),
    )


def _grammar(vocab: Any, grammar: str) -> Any:
    """llama.cpp's grammar sampler for a GBNF grammar (its special tokens match by their text)."""
    sampler = llama_cpp.llama_sampler_init_grammar(vocab, grammar.encode(), b"root")
    if not sampler:
        raise EngineError("the grammar does not parse (GBNF with a 'root' rule)", "invalid_grammar")
    return sampler


# llama_token_data as numpy sees it: {int32 id; float logit; float p}, 12 bytes, no padding.
_TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])


def p_less_keep(logits: np.ndarray, *, norm: bool) -> np.ndarray:
    """Which candidates p-less keeps (arXiv 2509.23234), from logits already at temperature.

    A token stays when its probability is at least sum(p**2), the collision probability of the
    whole distribution; p-less-norm lowers that to (V * sum(p**2) - 1) / (V - 1), V the
    candidates still in the running (finite logits). The most likely token always stays.
    """
    weights = np.exp(logits - logits.max())
    total = weights.sum(dtype=np.float64)
    collision = float(np.dot(weights, weights)) / (total * total)
    if norm:
        n = int(np.count_nonzero(logits > -np.inf))
        collision = (n * collision - 1) / (n - 1) if n > 1 else 0.0
    # p >= threshold is weight >= threshold * total; the top token's weight is exactly 1.
    return weights >= min(collision * total, 1.0)


def _candidates(array: Any) -> np.ndarray:
    """A llama_token_data_array's candidates as a numpy view (a sampler may have moved its
    data pointer, so it is read from the array)."""
    buffer = (ctypes.c_char * (array.size * _TOKEN_DATA.itemsize)).from_address(
        ctypes.cast(array.data, ctypes.c_void_p).value
    )
    return np.frombuffer(buffer, dtype=_TOKEN_DATA)


def _apply_p_less(cur_p: Any, *, norm: bool) -> None:
    """Move the candidates p-less keeps to the front of the array, in order, and cut it there."""
    array = cur_p.contents
    data = _candidates(array)
    kept = np.flatnonzero(p_less_keep(data["logit"], norm=norm))
    data[: kept.size] = data[kept]
    array.size = kept.size


@llama_cpp.llama_sampler_i_apply
def _p_less_apply(_sampler: Any, cur_p: Any) -> None:
    _apply_p_less(cur_p, norm=False)


@llama_cpp.llama_sampler_i_apply
def _p_less_norm_apply(_sampler: Any, cur_p: Any) -> None:
    _apply_p_less(cur_p, norm=True)


# One interface per variant, alive as long as the module; each sampler made from one has no
# state of its own (ctx NULL), so llama_sampler_free only deletes it.
_P_LESS = {
    False: llama_cpp.llama_sampler_i(apply=_p_less_apply),
    True: llama_cpp.llama_sampler_i(apply=_p_less_norm_apply),
}


def p_less_sampler(*, norm: bool) -> Any:
    """A llama.cpp sampler that runs p-less (or p-less-norm) on the candidates it is given."""
    return llama_cpp.llama_sampler_init(ctypes.byref(_P_LESS[norm]), None)


def _seed(params: SamplingParams) -> int:
    return llama_cpp.LLAMA_DEFAULT_SEED if params.seed is None else params.seed & 0xFFFFFFFF


def _stage(stage: SamplerStage, vocab: Any, n_ctx: int, params: SamplingParams) -> Any | None:
    """llama.cpp's sampler for one stage of the chain; None where its setting leaves it off."""
    if stage == "penalties":
        neutral = (params.repeat_penalty, params.frequency_penalty, params.presence_penalty)
        return None if neutral == (1, 0, 0) else _penalties(params)
    if stage == "dry":
        return _dry(vocab, params, n_ctx) if params.dry_multiplier > 0 else None
    if stage == "top_k":
        return llama_cpp.llama_sampler_init_top_k(params.top_k) if params.top_k > 0 else None
    if stage == "typ_p" and params.typical_p < 1.0:
        return llama_cpp.llama_sampler_init_typical(params.typical_p, 1)
    if stage == "top_p" and params.top_p < 1.0:
        return llama_cpp.llama_sampler_init_top_p(params.top_p, 1)
    if stage == "min_p" and params.min_p > 0.0:
        return llama_cpp.llama_sampler_init_min_p(params.min_p, 1)
    if stage == "xtc" and params.xtc_probability > 0:
        return llama_cpp.llama_sampler_init_xtc(
            params.xtc_probability, params.xtc_threshold, 1, _seed(params)
        )
    if stage == "temperature":
        return llama_cpp.llama_sampler_init_temp(params.temperature)
    return None


# With temperature <= 0 the most likely token is taken: only these stages can change which.
_GREEDY_STAGES = ("penalties", "dry")


def _pick(n_vocab: int, params: SamplingParams) -> Any:
    """The sampler that draws the token: greedy, Mirostat 1 or 2, or from the distribution."""
    if params.temperature <= 0:
        return llama_cpp.llama_sampler_init_greedy()
    tau, eta = params.mirostat_tau, params.mirostat_eta
    if params.mirostat == 1:
        return llama_cpp.llama_sampler_init_mirostat(n_vocab, _seed(params), tau, eta, 100)
    if params.mirostat == 2:
        return llama_cpp.llama_sampler_init_mirostat_v2(_seed(params), tau, eta)
    return llama_cpp.llama_sampler_init_dist(_seed(params))


def build_chain(
    vocab: Any, n_vocab: int, n_ctx: int, params: SamplingParams, banned: Iterable[int] = ()
) -> Any:
    """A sampler chain as llama-server builds one: grammar, logit bias, then the `samplers`
    stages in order (Mirostat: temperature alone), p-less last, then the pick; `banned` tokens
    never win."""
    chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())

    def add(sampler: Any) -> None:
        llama_cpp.llama_sampler_chain_add(chain, sampler)

    # JSON schemas, lark grammars and grammars with markers are held by llguidance
    # (backends/guidance.py), which masks the logits before the chain runs.
    if params.grammar is not None and not held_by_guidance(params):
        add(_grammar(vocab, params.grammar))
    biases = list(params.logit_bias) + [(token, -_BIAS_LIMIT) for token in banned]
    if biases:
        add(_logit_bias(n_vocab, biases))
    stages = ("temperature",) if params.mirostat else params.samplers
    for stage in stages:
        if params.temperature > 0 or stage in _GREEDY_STAGES:
            sampler = _stage(stage, vocab, n_ctx, params)
            if sampler is not None:
                add(sampler)
    if params.temperature > 0 and (params.p_less or params.p_less_norm):
        add(p_less_sampler(norm=params.p_less_norm))
    add(_pick(n_vocab, params))
    return chain


def sample_after_chain(
    chain: Any, ctx: Any, index: int, n_vocab: int, top_n: int, greedy: bool
) -> Sample:
    """Sample from output `index` through `chain` as llama_sampler_sample does (apply, then
    accept), keeping what the chain left: the token's probability among those candidates and
    its top_n rivals with a probability above 0, as log-probabilities (llama-server's
    post_sampling_probs). A greedy pick computes no distribution: it has probability 1."""
    logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, index), shape=(n_vocab,))
    data = np.zeros(n_vocab, dtype=_TOKEN_DATA)
    data["id"] = np.arange(n_vocab, dtype=np.int32)
    data["logit"] = logits
    candidates = llama_cpp.llama_token_data_array(
        data=data.ctypes.data_as(llama_cpp.llama_token_data_p),
        size=n_vocab,
        selected=-1,
        sorted=False,
    )
    llama_cpp.llama_sampler_apply(chain, ctypes.byref(candidates))
    kept = _candidates(candidates)
    token = int(kept["id"][candidates.selected])
    llama_cpp.llama_sampler_accept(chain, token)
    if greedy:
        return Sample(token, 0.0, ((token, 0.0),) if top_n > 0 else ())
    p = kept["p"].astype(np.float64)
    chosen = float(p[candidates.selected])
    order = np.argsort(-p, kind="stable")[:top_n]
    top = tuple((int(kept["id"][i]), math.log(p[i])) for i in order if p[i] > 0)
    return Sample(token, math.log(chosen) if chosen > 0 else -math.inf, top)


def sample_with_logprobs(ctx: Any, index: int, n_vocab: int, token: int, top_n: int) -> Sample:
    """The model's own log-probability of `token` at output `index`, and its top_n rivals."""
    logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, index), shape=(n_vocab,))
    peak = float(logits.max())
    log_total = peak + math.log(float(np.exp(logits - peak).sum()))
    top: tuple[tuple[int, float], ...] = ()
    if top_n > 0:
        best = np.argpartition(logits, -top_n)[-top_n:]
        best = best[np.argsort(logits[best])[::-1]]
        top = tuple((int(t), float(logits[t]) - log_total) for t in best)
    return Sample(token, float(logits[token]) - log_total, top)
