"""M-RoPE positions on the MLX engine (the Qwen2-VL family): an image's grid positions, and
the position ids (3 sections: temporal, row, column) of a slot's prompt chunk or decode step."""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx
import numpy as np

from mlxcel.engine.positions import Jumps, MropePositions


def grid_positions(t: int, h: int, w: int) -> MropePositions:
    """The positions of an image of t x h x w tokens (its grid after the spatial merge): each
    token at its (frame, row, column) from the image's start; the text after it continues at
    the start plus its grid's longer side (Qwen2-VL's get_rope_index: max + 1)."""
    frames, rows, columns = np.meshgrid(np.arange(t), np.arange(h), np.arange(w), indexing="ij")
    base = np.stack([frames.ravel(), rows.ravel(), columns.ravel(), np.zeros(t * h * w, int)])
    moves = np.zeros_like(base)
    moves[:3] = 1
    return MropePositions(base.astype(np.int32), moves.astype(np.int32), max(t, h, w))


def chunk_positions(
    jumps: Jumps,
    start: int,
    n_tokens: int,
    media: Sequence[tuple[int, np.ndarray]],
    mrope: Sequence[MropePositions | None],
) -> mx.array:
    """Position ids ([3, 1, n_tokens]) of a chunk of a sequence's tokens from token index
    `start`: text one position a token in all three sections, each image (offset in the
    chunk, rows) on its grid; `jumps` learns where each image moves the positions."""
    out = np.empty((3, n_tokens), np.int32)
    done, pos = 0, jumps.position(start)
    for (at, rows), image in zip(media, mrope or (None,) * len(media), strict=True):
        out[:, done:at] = pos + np.arange(at - done)
        pos += at - done
        size = len(rows)
        if image is None:
            out[:, at : at + size], n_pos = pos + np.arange(size), size
        else:
            out[:, at : at + size], n_pos = image.at(pos).reshape(4, size)[:3], image.n_pos
        jumps.advance(pos, size, n_pos)
        pos, done = pos + n_pos, at + size
    out[:, done:] = pos + np.arange(n_tokens - done)
    return mx.array(out)[:, None]


def decode_positions(positions: Sequence[int]) -> mx.array:
    """Position ids ([3, rows, 1]) of one token a row, each row's at its own position."""
    column = mx.array(list(positions), dtype=mx.int32)[None, :, None]
    return mx.broadcast_to(column, (3, len(positions), 1))
