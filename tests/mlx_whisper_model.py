"""A tiny random-weight Whisper in the folder format mlx-whisper loads, built offline for the
tests, whose decoder is forced to say one word: its last layer norm has no gain, so every
position's output is the norm's bias, and only the word's embedding (and the first timestamp's)
points along it."""

from __future__ import annotations

import json
from pathlib import Path

# Whisper's English-only vocabulary (tiny.en's), a 30 s window of 80 mel bins, tiny widths.
DIMENSIONS = {
    "n_mels": 80,
    "n_audio_ctx": 1500,
    "n_audio_state": 32,
    "n_audio_head": 2,
    "n_audio_layer": 1,
    "n_vocab": 51864,
    "n_text_ctx": 16,
    "n_text_state": 32,
    "n_text_head": 2,
    "n_text_layer": 1,
}
WORD = " hello"
# The word's logit over every other token's 0, and the first timestamp's over the others.
WORD_LOGIT = 30.0
TIMESTAMP_LOGIT = 20.0


def build_mlx_whisper(target: Path, seed: int = 0) -> Path:
    """Write config.json and weights.safetensors under `target`; the folder."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_whisper.tokenizer import get_tokenizer
    from mlx_whisper.whisper import ModelDimensions, Whisper

    mx.random.seed(seed)
    model = Whisper(ModelDimensions(**DIMENSIONS))
    tokenizer = get_tokenizer(multilingual=False)
    (word,) = tokenizer.encode(WORD)
    direction = mx.zeros((DIMENSIONS["n_text_state"],)).at[0].add(1.0)
    embedding = model.decoder.token_embedding.weight
    embedding[:, 0] = 0.0
    embedding[word, 0] = WORD_LOGIT
    embedding[tokenizer.timestamp_begin, 0] = TIMESTAMP_LOGIT
    model.decoder.ln.weight = mx.zeros_like(model.decoder.ln.weight)
    model.decoder.ln.bias = direction
    target.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(target / "weights.safetensors"), dict(tree_flatten(model.parameters())))
    (target / "config.json").write_text(json.dumps({"model_type": "whisper", **DIMENSIONS}))
    return target
