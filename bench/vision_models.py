"""A random-weight LLaVA-style vision projector (mmproj GGUF) for a text GGUF, built offline.

    python bench/vision_models.py --out DIR [--image-size 32 --patch-size 8]

libmtmd reads it as llama.cpp's `mlp` projector: a CLIP ViT (class token, learned positions,
pre-norm blocks) whose patch features a two-layer MLP maps into the text model's embedding
width. An image becomes (image size / patch size)^2 tokens whatever its own size. Weights are
seeded random (normal * 0.02, norms 1), F32, written with gguf-py; prints the path.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from bench.models import CACHE_DIR, WEIGHT_STD, digest, seeded_normal, write_once
from gguf import GGUFWriter

Writer = Callable[[Any, Path, int], None]
"""Writes a projector of a shape to a path with a seed."""


@dataclass(frozen=True)
class VisionShape:
    """The vision tower's dimensions and the text model's embedding width it projects to."""

    text_hidden: int
    image_size: int = 32
    patch_size: int = 8
    hidden: int = 32
    ffn: int = 64
    heads: int = 4
    layers: int = 2

    @property
    def image_tokens(self) -> int:
        """Tokens one image takes in the prompt."""
        return (self.image_size // self.patch_size) ** 2


def tensors(shape: VisionShape) -> Iterator[tuple[str, tuple[int, ...]]]:
    """Every tensor's name and numpy shape (rows = outputs), as clip.cpp names them."""
    n, patch = shape.hidden, shape.patch_size
    yield "v.patch_embd.weight", (n, 3, patch, patch)
    yield "v.class_embd", (n,)
    yield "v.position_embd.weight", (shape.image_tokens + 1, n)
    yield "v.pre_ln.weight", (n,)
    yield "v.pre_ln.bias", (n,)
    yield from blocks(shape)
    yield "mm.0.weight", (shape.text_hidden, n)
    yield "mm.0.bias", (shape.text_hidden,)
    yield "mm.2.weight", (shape.text_hidden, shape.text_hidden)
    yield "mm.2.bias", (shape.text_hidden,)


def blocks(shape: Any) -> Iterator[tuple[str, tuple[int, ...]]]:
    """The tower's pre-norm transformer blocks (biases everywhere, a two-layer MLP), for a
    shape dataclass with VisionShape's fields."""
    n = shape.hidden
    for i in range(shape.layers):
        block = f"v.blk.{i}"
        for part in ("attn_q", "attn_k", "attn_v", "attn_out"):
            yield f"{block}.{part}.weight", (n, n)
            yield f"{block}.{part}.bias", (n,)
        for norm in ("ln1", "ln2"):
            yield f"{block}.{norm}.weight", (n,)
            yield f"{block}.{norm}.bias", (n,)
        yield f"{block}.ffn_up.weight", (shape.ffn, n)
        yield f"{block}.ffn_up.bias", (shape.ffn,)
        yield f"{block}.ffn_down.weight", (n, shape.ffn)
        yield f"{block}.ffn_down.bias", (n,)


def _values(name: str, dims: tuple[int, ...], seed: int) -> np.ndarray:
    if name.endswith(("ln1.weight", "ln2.weight", "pre_ln.weight")):
        return np.ones(dims, dtype=np.float32)
    return seeded_normal(name, dims, seed)


def write(shape: VisionShape, path: Path, seed: int = 0) -> None:
    """The projector GGUF at `path`."""
    writer = GGUFWriter(path, "clip")
    writer.add_name("random llava-style projector")
    add_tower(writer, "mlp", shape, 1e-5)
    writer.add_vision_image_mean([0.5, 0.5, 0.5])
    writer.add_vision_image_std([0.5, 0.5, 0.5])
    writer.add_vision_use_gelu(True)
    finish(writer, ((name, _values(name, dims, seed)) for name, dims in tensors(shape)))


# An Idefics3-style projector's pixel shuffle: each side of the patch grid shrinks by this.
IDEFICS3_SCALE = 2


def write_idefics3(shape: VisionShape, path: Path, seed: int = 0) -> None:
    """An Idefics3-style (llava-uhd) projector GGUF at `path`: libmtmd cuts an image larger
    than twice `image_size` into slices of `image_size` and an overview, each a chunk of its
    own of (image_size / patch_size / IDEFICS3_SCALE)^2 tokens."""
    writer = GGUFWriter(path, "clip")
    writer.add_name("random idefics3-style projector")
    add_tower(writer, "idefics3", shape, 1e-6)
    writer.add_uint32("clip.vision.projector.scale_factor", IDEFICS3_SCALE)
    writer.add_uint32("clip.vision.preproc_image_size", 2 * shape.image_size)
    writer.add_vision_image_mean([0.5, 0.5, 0.5])
    writer.add_vision_image_std([0.5, 0.5, 0.5])
    n = shape.hidden
    named = [
        ("v.patch_embd.weight", (n, 3, shape.patch_size, shape.patch_size)),
        ("v.position_embd.weight", (shape.image_tokens, n)),
        *blocks(shape),
        ("v.post_ln.weight", (n,)),
        ("v.post_ln.bias", (n,)),
        ("mm.model.fc.weight", (shape.text_hidden, n * IDEFICS3_SCALE**2)),
    ]
    finish(writer, ((name, _values(name, dims, seed)) for name, dims in named))


def add_tower(writer: GGUFWriter, projector: str, shape: Any, eps: float) -> None:
    """The keys of a vision tower of `shape` (a shape dataclass with VisionShape's fields)
    under llama.cpp's projector type `projector`."""
    writer.add_clip_has_vision_encoder(True)
    writer.add_clip_projector_type(projector)
    writer.add_vision_image_size(shape.image_size)
    writer.add_vision_patch_size(shape.patch_size)
    writer.add_vision_embedding_length(shape.hidden)
    writer.add_vision_feed_forward_length(shape.ffn)
    writer.add_vision_projection_dim(shape.text_hidden)
    writer.add_vision_block_count(shape.layers)
    writer.add_vision_head_count(shape.heads)
    writer.add_vision_attention_layernorm_eps(eps)


def finish(writer: GGUFWriter, named: Iterable[tuple[str, np.ndarray]]) -> None:
    """Add the tensors to a projector's writer, write the file and close it."""
    for name, values in named:
        writer.add_tensor(name, values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def cached(prefix: str, shape: Any, out_dir: Path, seed: int, write: Writer) -> Path:
    """The projector `write` makes of a shape dataclass, unless `out_dir` already holds it."""
    path = out_dir / f"{prefix}-{digest(asdict(shape), seed, WEIGHT_STD)}.gguf"
    write_once(path, lambda partial: write(shape, partial, seed))
    return path


def build(shape: VisionShape, out_dir: Path, seed: int = 0) -> Path:
    """The projector for `shape`, written unless `out_dir` already holds it."""
    return cached("random-mmproj", shape, out_dir, seed, write)


def build_idefics3(shape: VisionShape, out_dir: Path, seed: int = 0) -> Path:
    """The Idefics3-style projector for `shape`, written unless `out_dir` already holds it."""
    return cached("random-idefics3-mmproj", shape, out_dir, seed, write_idefics3)


def main() -> None:
    """Build (or find) a projector and print its path."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=CACHE_DIR)
    parser.add_argument("--text-hidden", type=int, default=64)
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--patch-size", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    shape = VisionShape(args.text_hidden, args.image_size, args.patch_size)
    print(build(shape, args.out, args.seed))


if __name__ == "__main__":
    main()
