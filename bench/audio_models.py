"""A random-weight Voxtral-style audio projector (mmproj GGUF) for a text GGUF, built offline.

    python bench/audio_models.py --out DIR [--text-hidden 64 --stack-factor 16]

libmtmd reads it as llama.cpp's `voxtral` projector: a Whisper encoder (two 1-D convolutions,
learned positions, pre-norm blocks) over 30 s windows of log-mel frames (3000 frames, 1500
positions), average-pooled by 2, `stack_factor` positions stacked into one row, and a
two-layer MLP into the text model's embedding width. Every started 30 s of audio (with the
30 s of silence libmtmd's Whisper preprocessing appends, a clip of L seconds is
floor(L / 30) + 1 windows) becomes `window_tokens` prompt tokens. Weights are seeded random
(normal * 0.02, norms 1), F32 but the convolutions F16 as llama.cpp's converter writes them;
prints the path.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from bench.models import CACHE_DIR, seeded_normal
from bench.vision_models import cached, finish
from gguf import GGUFWriter

# Whisper's window: 30 s of 10 ms mel frames, halved by the second convolution's stride.
WINDOW_FRAMES = 3000
WINDOW_SECONDS = 30
SAMPLE_RATE = 16_000


@dataclass(frozen=True)
class AudioShape:
    """The audio tower's dimensions and the text model's embedding width it projects to."""

    text_hidden: int
    mel_bins: int = 16
    hidden: int = 32
    ffn: int = 64
    heads: int = 4
    layers: int = 2
    stack_factor: int = 16
    projector_ffn: int = 64

    @property
    def window_tokens(self) -> int:
        """Prompt tokens of one 30 s window (clip.cpp's count for voxtral)."""
        stacked = -(-WINDOW_FRAMES // self.stack_factor)
        return stacked // 2 // 2


def tensors(shape: AudioShape) -> Iterator[tuple[str, tuple[int, ...]]]:
    """Every tensor's name and numpy shape (rows = outputs), as clip.cpp names them."""
    n = shape.hidden
    yield "a.conv1d.1.weight", (n, shape.mel_bins, 3)
    yield "a.conv1d.1.bias", (n, 1)
    yield "a.conv1d.2.weight", (n, n, 3)
    yield "a.conv1d.2.bias", (n, 1)
    yield "a.position_embd.weight", (WINDOW_FRAMES // 2, n)
    for i in range(shape.layers):
        block = f"a.blk.{i}"
        for part in ("attn_q", "attn_k", "attn_v", "attn_out"):
            yield f"{block}.{part}.weight", (n, n)
            # Whisper's key projection has no bias (clip.cpp checks).
            if part != "attn_k":
                yield f"{block}.{part}.bias", (n,)
        for norm in ("ln1", "ln2"):
            yield f"{block}.{norm}.weight", (n,)
            yield f"{block}.{norm}.bias", (n,)
        yield f"{block}.ffn_up.weight", (shape.ffn, n)
        yield f"{block}.ffn_up.bias", (shape.ffn,)
        yield f"{block}.ffn_down.weight", (n, shape.ffn)
        yield f"{block}.ffn_down.bias", (n,)
    yield "a.post_ln.weight", (n,)
    yield "a.post_ln.bias", (n,)
    yield "mm.a.mlp.1.weight", (shape.projector_ffn, n * shape.stack_factor)
    yield "mm.a.mlp.2.weight", (shape.text_hidden, shape.projector_ffn)


def _values(name: str, dims: tuple[int, ...], seed: int) -> np.ndarray:
    if name.endswith(("ln1.weight", "ln2.weight", "post_ln.weight")):
        return np.ones(dims, dtype=np.float32)
    values = seeded_normal(name, dims, seed)
    return values.astype(np.float16) if name.startswith("a.conv1d") and "weight" in name else values


def write(shape: AudioShape, path: Path, seed: int = 0) -> None:
    """The projector GGUF at `path`."""
    writer = GGUFWriter(path, "clip")
    writer.add_name("random voxtral-style audio projector")
    writer.add_clip_has_vision_encoder(False)
    writer.add_clip_has_audio_encoder(True)
    writer.add_clip_projector_type("voxtral")
    writer.add_audio_num_mel_bins(shape.mel_bins)
    writer.add_audio_embedding_length(shape.hidden)
    writer.add_audio_feed_forward_length(shape.ffn)
    writer.add_audio_projection_dim(shape.text_hidden)
    writer.add_audio_block_count(shape.layers)
    writer.add_audio_head_count(shape.heads)
    writer.add_audio_attention_layernorm_eps(1e-5)
    writer.add_audio_stack_factor(shape.stack_factor)
    finish(writer, ((name, _values(name, dims, seed)) for name, dims in tensors(shape)))


def build(shape: AudioShape, out_dir: Path, seed: int = 0) -> Path:
    """The projector for `shape`, written unless `out_dir` already holds it."""
    return cached("random-audio-mmproj", shape, out_dir, seed, write)


def main() -> None:
    """Build (or find) a projector and print its path."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=CACHE_DIR)
    parser.add_argument("--text-hidden", type=int, default=64)
    parser.add_argument("--stack-factor", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    shape = AudioShape(args.text_hidden, stack_factor=args.stack_factor)
    print(build(shape, args.out, args.seed))


if __name__ == "__main__":
    main()
