"""Request sampling fields -> SamplingParams; the one place defaults are applied."""

from __future__ import annotations

from mlxcel.api.schemas.common import SamplingFields
from mlxcel.engine.types import SamplingParams

# llama-server's built-in sampling defaults, used when a request leaves a field out.
BUILTIN_TEMPERATURE = 0.8
BUILTIN_TOP_P = 0.95
BUILTIN_TOP_K = 40
BUILTIN_MIN_P = 0.05
BUILTIN_REPEAT_LAST_N = 64


def _pick(value: float | None, default: float) -> float:
    return default if value is None else value


def sampling_params(
    request: SamplingFields, token_limit: int | None, *, n_predict: int, room: int, n_ctx: int
) -> SamplingParams:
    """Sampling for one request: its own fields, then the server's, then built-ins.

    `room` is how many tokens fit in the context after the prompt; `n_predict` < 0 means
    the server sets no limit of its own.
    """
    limit = token_limit if token_limit is not None else (n_predict if n_predict >= 0 else room)
    repeat_penalty = request.repeat_penalty or request.repetition_penalty
    last_n = BUILTIN_REPEAT_LAST_N if request.repeat_last_n is None else request.repeat_last_n
    return SamplingParams(
        max_tokens=max(1, min(limit, room)),
        temperature=_pick(request.temperature, BUILTIN_TEMPERATURE),
        top_p=_pick(request.top_p, BUILTIN_TOP_P),
        top_k=int(_pick(request.top_k, BUILTIN_TOP_K)),
        min_p=_pick(request.min_p, BUILTIN_MIN_P),
        seed=request.seed,
        presence_penalty=_pick(request.presence_penalty, 0.0),
        frequency_penalty=_pick(request.frequency_penalty, 0.0),
        repeat_penalty=_pick(repeat_penalty, 1.0),
        repeat_last_n=n_ctx if last_n == -1 else last_n,
        stop=request.stop_strings(),
    )
