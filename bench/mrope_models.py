"""A random-weight Qwen2-VL-style vision projector (mmproj GGUF) for a text GGUF of arch
`qwen2vl`, built offline.

    python bench/mrope_models.py --out DIR [--text-hidden 64 --patch-size 8]

libmtmd reads it as llama.cpp's `qwen2vl_merger` projector: a ViT whose patch embedding is
two convolutions (Qwen2-VL's two video frames; a still image goes through both), M-RoPE
inside the tower, pre-norm blocks, and a merger that folds each 2x2 of patches into one row
and maps it through a two-layer MLP into the text model's embedding width. An image keeps
its aspect ratio: resized to multiples of 2 * patch size, it takes (width / 2 patches) x
(height / 2 patches) tokens, and the text model places them on that grid with M-RoPE
positions (libmtmd's `mtmd_decode_use_mrope`). Weights are seeded random (normal * 0.02,
norms 1), F32 but the patch convolutions F16 as llama.cpp's converter writes them; prints
the path.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from bench.models import CACHE_DIR, seeded_normal
from bench.vision_models import add_tower, blocks, cached, finish
from gguf import GGUFWriter

# Patches a side of one merged token (clip.cpp's default for Qwen2-VL).
MERGE = 2


@dataclass(frozen=True)
class MropeShape:
    """The vision tower's dimensions and the text model's embedding width it projects to."""

    text_hidden: int
    patch_size: int = 8
    hidden: int = 32
    ffn: int = 64
    heads: int = 4
    layers: int = 2
    image_size: int = 64
    """The side clip.cpp's warm-up assumes; images keep their own size."""


def tensors(shape: MropeShape) -> Iterator[tuple[str, tuple[int, ...]]]:
    """Every tensor's name and numpy shape (rows = outputs), as clip.cpp names them."""
    n, patch = shape.hidden, shape.patch_size
    yield "v.patch_embd.weight", (n, 3, patch, patch)
    yield "v.patch_embd.weight.1", (n, 3, patch, patch)
    yield from blocks(shape)
    yield "v.post_ln.weight", (n,)
    yield "v.post_ln.bias", (n,)
    merged = n * MERGE * MERGE
    yield "mm.0.weight", (merged, merged)
    yield "mm.0.bias", (merged,)
    yield "mm.2.weight", (shape.text_hidden, merged)
    yield "mm.2.bias", (shape.text_hidden,)


def _values(name: str, dims: tuple[int, ...], seed: int) -> np.ndarray:
    if name.endswith(("ln1.weight", "ln2.weight", "post_ln.weight")):
        return np.ones(dims, dtype=np.float32)
    values = seeded_normal(name, dims, seed)
    return values.astype(np.float16) if name.startswith("v.patch_embd") else values


def write(shape: MropeShape, path: Path, seed: int = 0) -> None:
    """The projector GGUF at `path`."""
    writer = GGUFWriter(path, "clip")
    writer.add_name("random qwen2-vl-style projector")
    add_tower(writer, "qwen2vl_merger", shape, 1e-6)
    writer.add_vision_image_mean([0.48145466, 0.4578275, 0.40821073])
    writer.add_vision_image_std([0.26862954, 0.26130258, 0.27577711])
    writer.add_vision_use_gelu(False)
    writer.add_vision_use_silu(False)
    finish(writer, ((name, _values(name, dims, seed)) for name, dims in tensors(shape)))


def build(shape: MropeShape, out_dir: Path, seed: int = 0) -> Path:
    """The projector for `shape`, written unless `out_dir` already holds it."""
    return cached("random-mrope-mmproj", shape, out_dir, seed, write)


def main() -> None:
    """Build (or find) a projector and print its path."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=CACHE_DIR)
    parser.add_argument("--text-hidden", type=int, default=64)
    parser.add_argument("--patch-size", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(build(MropeShape(args.text_hidden, args.patch_size), args.out, args.seed))


if __name__ == "__main__":
    main()
