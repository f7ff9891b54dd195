"""Request sampling fields -> SamplingParams; the one place where defaults are decided.

Order, first that is set wins: the request's field, the server's flag (`--temp`, `--top-p`,
`--top-k`, `--min-p`, `--repeat-penalty`, `--p-less`, `--p-less-norm`, `-n`), the model's own
generation config, then the built-ins below (llama-server's), or SamplingParams' own field
defaults.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mlxcel.engine.sampling import SamplingDefaults
from mlxcel.engine.types import DRY_BREAKERS, SamplerStage, SamplingParams, TextModel
from mlxcel.protocol.common import SamplingFields
from mlxcel.protocol.errors import invalid_request
from mlxcel.serving.structured import output_schema

# llama-server's sampler names and the other spellings it takes for them.
_STAGE_NAMES: dict[str, SamplerStage] = {
    "penalties": "penalties",
    "dry": "dry",
    "top_n_sigma": "top_n_sigma",
    "top_k": "top_k",
    "typ_p": "typ_p",
    "typical_p": "typ_p",
    "typical": "typ_p",
    "top_p": "top_p",
    "nucleus": "top_p",
    "min_p": "min_p",
    "xtc": "xtc",
    "temperature": "temperature",
    "temp": "temperature",
}
# ... and its one-letter codes, for `samplers` given as a string.
_STAGE_LETTERS: dict[str, SamplerStage] = {
    "e": "penalties",
    "d": "dry",
    "s": "top_n_sigma",
    "k": "top_k",
    "y": "typ_p",
    "p": "top_p",
    "m": "min_p",
    "x": "xtc",
    "t": "temperature",
}


def _pick(value: float | None, default: float) -> float:
    return default if value is None else value


def _p_less(request: SamplingFields, defaults: SamplingDefaults) -> tuple[bool, bool]:
    """(p_less, p_less_norm): a request that sets either field picks the variant, or none."""
    if request.p_less is None and request.p_less_norm is None:
        return defaults.p_less, defaults.p_less_norm
    if request.p_less and request.p_less_norm:
        raise invalid_request("set either p_less or p_less_norm, not both", "p_less_norm")
    return bool(request.p_less), bool(request.p_less_norm)


def _given(**values: Any) -> dict[str, Any]:
    """The values a request set; the others keep SamplingParams' defaults."""
    return {name: value for name, value in values.items() if value is not None}


def sampler_stages(samplers: Sequence[str] | str | None) -> tuple[SamplerStage, ...] | None:
    """llama-server's `samplers` as stage names (None: the default order); a 400 if unknown."""
    if samplers is None:
        return None
    if isinstance(samplers, str):
        names, table = list(samplers), _STAGE_LETTERS
    else:
        names, table = [name.replace("-", "_").lower() for name in samplers], _STAGE_NAMES
    unknown = [name for name in names if name not in table]
    if unknown:
        raise invalid_request(
            f"unknown sampler '{unknown[0]}'; this server has {', '.join(sorted(set(table)))}",
            "samplers",
        )
    return tuple(table[name] for name in names)


def logit_bias(request: SamplingFields, generator: TextModel) -> tuple[tuple[int, float], ...]:
    """logit_bias as (token id, bias) pairs: a text key biases every token of its text, and
    llama-server's `false` bans the token."""
    pairs: list[tuple[int, float]] = []
    for key, bias in request.logit_bias or []:
        if key.lstrip("-").isdigit():
            pairs.append((int(key), bias))
        else:
            ids = generator.tokenize(key, add_special=False, parse_special=False)
            pairs.extend((token, bias) for token in ids)
    return tuple(pairs)


def sampling_params(
    request: SamplingFields,
    token_limit: int | None,
    *,
    defaults: SamplingDefaults,
    n_predict: int,
    room: int,
    n_ctx: int,
    bias: Sequence[tuple[int, float]] = (),
) -> SamplingParams:
    """Sampling for one request.

    `room` is how many tokens fit in the context after the prompt; `n_predict` < 0 means
    the server sets no limit of its own. A request's limit of 0 generates nothing.
    """
    if token_limit is not None:
        max_tokens = min(token_limit, room)
    else:
        max_tokens = max(1, min(n_predict if n_predict >= 0 else room, room))
    repeat_penalty = request.repeat_penalty or request.repetition_penalty
    last_n = int(_pick(request.repeat_last_n, defaults.repeat_last_n))
    breakers = request.dry_sequence_breakers
    schema = output_schema(request)
    p_less, p_less_norm = _p_less(request, defaults)
    if schema is not None and request.grammar is not None:
        raise invalid_request("set either a grammar or a JSON schema, not both", "grammar")
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=_pick(request.temperature, defaults.temperature),
        top_p=_pick(request.top_p, defaults.top_p),
        top_k=int(_pick(request.top_k, defaults.top_k)),
        min_p=_pick(request.min_p, defaults.min_p),
        seed=defaults.seed if request.seed is None else request.seed,
        typical_p=_pick(request.typical_p, 1.0),
        presence_penalty=_pick(request.presence_penalty, 0.0),
        frequency_penalty=_pick(request.frequency_penalty, 0.0),
        repeat_penalty=_pick(repeat_penalty, defaults.repeat_penalty),
        repeat_last_n=n_ctx if last_n == -1 else last_n,
        dry_multiplier=_pick(request.dry_multiplier, 0.0),
        dry_base=_pick(request.dry_base, 1.75),
        dry_allowed_length=int(_pick(request.dry_allowed_length, 2)),
        dry_penalty_last_n=int(_pick(request.dry_penalty_last_n, -1)),
        dry_sequence_breakers=DRY_BREAKERS if breakers is None else tuple(breakers),
        xtc_probability=_pick(request.xtc_probability, 0.0),
        xtc_threshold=_pick(request.xtc_threshold, 0.1),
        p_less=p_less,
        p_less_norm=p_less_norm,
        logit_bias=tuple(bias),
        min_tokens=request.min_tokens,
        ignore_eos=request.ignore_eos,
        stop=request.stop_strings(),
        stop_token_ids=tuple(request.stop_token_ids or ()),
        include_stop_str=request.include_stop_str_in_output,
        logprobs=request.top_logprobs_wanted(),
        post_sampling_probs=bool(request.post_sampling_probs),
        json_schema=schema,
        grammar=request.grammar,
        mirostat=request.mirostat,
        t_max_predict_ms=request.t_max_predict_ms,
        cache_prompt=request.cache_prompt,
        id_slot=request.id_slot,
        return_progress=request.return_progress,
        **_given(
            samplers=sampler_stages(request.samplers),
            mirostat_tau=request.mirostat_tau,
            mirostat_eta=request.mirostat_eta,
        ),
    )
