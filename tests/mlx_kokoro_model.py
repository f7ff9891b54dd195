"""A tiny random-weight MLX Kokoro folder, built offline with mlx-audio's own Kokoro model, laid
out as mlx-community/Kokoro-82M-bf16 is (config.json, model.safetensors in the checkpoint's
layout, voices/<name>.safetensors). mlx-audio's decoder fixes its widths (512 and 1024
channels) whatever the config, so only the text side is small; one frame per phoneme
(max_dur 1) keeps the decoder's work to a few frames."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten

from mlxcel.backends.audio.kokoro_text import kokoro_vocab

VOICES = ("af_heart", "am_adam")
# Samples per frame: the upsample rates (10, 6) times the iSTFT hop (5), times the decoder's 2.
SAMPLES_PER_FRAME = 600


def _config() -> dict[str, object]:
    return {
        "model_type": "kokoro",
        "istftnet": {
            "upsample_kernel_sizes": [20, 12],
            "upsample_rates": [10, 6],
            "gen_istft_hop_size": 5,
            "gen_istft_n_fft": 20,
            "resblock_dilation_sizes": [[1, 3, 5]],
            "resblock_kernel_sizes": [3],
            "upsample_initial_channel": 512,
        },
        "dim_in": 64,
        "dropout": 0.2,
        "hidden_dim": 512,
        "max_conv_dim": 512,
        "max_dur": 1,
        "multispeaker": True,
        "n_layer": 1,
        "n_mels": 80,
        "n_token": 178,
        "style_dim": 128,
        "text_encoder_kernel_size": 3,
        "plbert": {
            "hidden_size": 32,
            "num_attention_heads": 2,
            "intermediate_size": 64,
            "max_position_embeddings": 512,
            "num_hidden_layers": 1,
            "dropout": 0.1,
        },
        "vocab": kokoro_vocab(),
    }


def _as_checkpoint(model: object, key: str, value: mx.array) -> mx.array:
    """The array as the checkpoint holds it: what mlx-audio's sanitize turns into `value`
    (it transposes some convolution weights from PyTorch's layout)."""
    sanitize = model.sanitize  # type: ignore[attr-defined]
    for candidate in (value, value.transpose(0, 2, 1) if value.ndim == 3 else value):
        back = sanitize({key: candidate})
        same = list(back) == [key] and back[key].shape == value.shape
        if same and mx.array_equal(back[key], value).item():
            return candidate
    raise AssertionError(f"no checkpoint layout of {key} sanitizes back to it")


def build_mlx_kokoro(folder: Path) -> Path:
    """The folder, with random weights (seeded) and two voices."""
    from mlx_audio.tts.models.kokoro import Model, ModelConfig

    mx.random.seed(16)
    config = _config()
    model = Model(ModelConfig.from_dict(config))
    weights = {k: _as_checkpoint(model, k, v) for k, v in tree_flatten(model.parameters())}
    (folder / "voices").mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(folder / "model.safetensors"), weights)
    (folder / "config.json").write_text(json.dumps(config))
    for name in VOICES:
        voice = {"voice": mx.random.normal((510, 1, 256))}
        mx.save_safetensors(str(folder / "voices" / f"{name}.safetensors"), voice)
    return folder
