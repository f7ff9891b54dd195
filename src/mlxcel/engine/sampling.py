"""Sampling defaults per model: the server's flags over the model's own config over built-ins."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace


@dataclass(frozen=True)
class SamplingDefaults:
    """What a request that leaves a field out gets."""

    temperature: float = 0.8
    top_p: float = 0.95
    top_k: int = 40
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    p_less: bool = False
    p_less_norm: bool = False
    seed: int | None = None
    """The server's seed (-s); None: a random one per request."""

    def overridden(self, values: Mapping[str, float | None]) -> SamplingDefaults:
        """These defaults with every non-None value of `values` (same names) laid over."""
        names = {f.name for f in fields(self)}
        chosen = {
            k: type(getattr(self, k))(v) for k, v in values.items() if k in names and v is not None
        }
        return replace(self, **chosen)  # type: ignore[arg-type]


BUILTIN = SamplingDefaults()


def model_defaults(
    server: Mapping[str, float | None], model: Mapping[str, float | None]
) -> SamplingDefaults:
    """Defaults for one model: the server's flags over the model's config over built-ins."""
    return BUILTIN.overridden(model).overridden(server)
