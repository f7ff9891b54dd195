"""Tiny random LoRA adapters, built offline: GGUF adapters (llama.cpp's format, as its
convert_lora_to_gguf.py writes them) for a GGUF model's shapes, and mlx-lm adapter folders."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

TARGETS = ("attn_q", "attn_v", "ffn_down")


def gguf_adapter(
    model: Path,
    out: Path,
    *,
    seed: int,
    rank: int = 8,
    spread: float = 0.08,
    architecture: str | None = None,
    wrong_shape: bool = False,
) -> Path:
    """A GGUF LoRA adapter over every layer's q, v and down projections of `model`, its
    weights random (`spread` their standard deviation); `wrong_shape` builds one whose
    tensors do not fit the model, `architecture` one for another model family."""
    reader = gguf.GGUFReader(model)
    arch = architecture or str(reader.fields["general.architecture"].contents())
    writer = gguf.GGUFWriter(out, arch)
    writer.add_string("general.type", "adapter")
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", float(rank))
    rng = np.random.default_rng(seed)
    for tensor in reader.tensors:
        name = tensor.name.removesuffix(".weight")
        if name.rpartition(".")[2] not in TARGETS:
            continue
        n_in, n_out = (int(d) for d in tensor.shape)  # ggml order: input dim first
        if wrong_shape:
            n_in += 16
        a = rng.normal(0, spread, (rank, n_in)).astype(np.float32)
        b = rng.normal(0, spread, (n_out, rank)).astype(np.float32)
        writer.add_tensor(f"{name}.weight.lora_a", a)
        writer.add_tensor(f"{name}.weight.lora_b", b)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out
