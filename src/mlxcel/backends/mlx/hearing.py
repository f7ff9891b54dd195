"""Audio on an mlx-vlm model that hears (Gemma 4): what its processor calls a clip, and a
clip's rows of input embeddings from its audio tower."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np

from mlxcel.engine.types import EngineError
from mlxcel.media.audio import Audio
from mlxcel.weights import HEARING_FAMILIES


@dataclass(frozen=True)
class Hearing:
    """How a model takes audio: the text that stands for a clip in the processor's prompt,
    the token its rows sit at, the sample rate its feature extractor takes, and the longest
    clip it lays out whole (None: no limit known)."""

    token: str
    token_id: int
    rate: int
    max_seconds: float | None
    extractor: Any


def hearing(config: Mapping[str, Any], processor: Any) -> Hearing | None:
    """The model's hearing, when it is of a family that hears and has an audio tower."""
    extractor = getattr(processor, "feature_extractor", None)
    token = getattr(processor, "audio_token", None)
    token_id = config.get("audio_token_id")
    if (
        config.get("model_type") not in HEARING_FAMILIES
        or config.get("audio_config") is None
        or extractor is None
        or not isinstance(token, str)
        or not token
        or not isinstance(token_id, int)
    ):
        return None
    # The processor lays out at most audio_seq_length tokens a clip (and its feature
    # extractor keeps that much sound): a longer clip would lose its end unsaid.
    tokens, ms = (
        getattr(processor, name, None) for name in ("audio_seq_length", "audio_ms_per_token")
    )
    longest = (
        tokens * ms / 1000 if isinstance(tokens, int) and isinstance(ms, int | float) else None
    )
    return Hearing(token, token_id, int(extractor.sampling_rate), longest, extractor)


def check_lengths(hearing: Hearing, clips: list[Audio]) -> None:
    """An EngineError for the first clip longer than the model lays out whole."""
    longest = hearing.max_seconds
    for clip in clips:
        if longest is not None and clip.seconds > longest:
            raise EngineError(
                f"an audio clip lasts {clip.seconds:.1f} s; this model hears at most "
                f"{longest:g} s a clip (split it into several input_audio parts)",
                "invalid_request",
            )


def clip_rows(
    input_embeddings: Callable[..., Any], hearing: Hearing, clip: Audio, tokens: int
) -> np.ndarray:
    """The clip's `tokens` rows of input embeddings (float32, [tokens, width]): its log-mel
    features on their own (so they do not depend on the request's other clips), through the
    model's get_input_embeddings (`input_embeddings`) over that many audio tokens."""
    samples = np.frombuffer(clip.samples, np.float32)
    features = hearing.extractor([samples], sampling_rate=hearing.rate, return_attention_mask=True)
    arrays = {key: mx.array(np.asarray(value)) for key, value in features.items()}
    ids = mx.full((1, tokens), hearing.token_id)
    rows = input_embeddings(input_ids=ids, **arrays).inputs_embeds[0]
    return np.array(rows.astype(mx.float32))
