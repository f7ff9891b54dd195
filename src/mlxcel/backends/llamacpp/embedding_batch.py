"""One llama_decode of embedding rows (an image or audio window) for one sequence."""

from __future__ import annotations

import ctypes
from typing import Any

import llama_cpp
import numpy as np


def decode_rows(
    ctx: Any, seq: int, rows: np.ndarray, positions: np.ndarray, *, logits: bool, causal: bool
) -> None:
    """Evaluate `rows` in sequence `seq` at `positions` (int32: one a row, or M-RoPE's four
    sections a row, section-major), the last row's logits kept if `logits`; attention both
    ways among the rows unless `causal` (Gemma 3's images)."""
    n, width = rows.shape
    batch = llama_cpp.llama_batch_init(n, width, 1)
    # A copy of the pointer: one read from a struct field is a view of the field.
    owned_pos = ctypes.cast(batch.pos, type(batch.pos))
    # llama_batch_init allocates one position a row: the batch reads ours for the decode.
    steps = (ctypes.c_int32 * len(positions)).from_buffer_copy(positions.tobytes())
    batch.pos = ctypes.cast(steps, type(batch.pos))
    try:
        data = np.ascontiguousarray(rows, dtype=np.float32)
        ctypes.memmove(batch.embd, data.ctypes.data, data.nbytes)
        for i in range(n):
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = seq
            batch.logits[i] = logits and i == n - 1
        batch.n_tokens = n
        if not causal:
            llama_cpp.llama_set_causal_attn(ctx, False)
        status = llama_cpp.llama_decode(ctx, batch)
        if not causal:
            llama_cpp.llama_set_causal_attn(ctx, True)
        if status != 0:
            raise RuntimeError(f"llama_decode failed on an image with status {status}")
    finally:
        batch.pos = owned_pos
        llama_cpp.llama_batch_free(batch)
