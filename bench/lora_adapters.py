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


# tests/mlx_model.py's tiny Llama: the widths of the layers the MLX adapters target.
MLX_TARGETS = {
    "self_attn.q_proj": (64, 64),
    "self_attn.v_proj": (64, 32),
    "mlp.down_proj": (128, 64),
}


def mlx_adapter(
    out: Path,
    *,
    seed: int,
    rank: int = 4,
    scale: float = 4.0,
    peft: bool = False,
    wrong_shape: bool = False,
    layers: int = 2,
) -> Path:
    """An adapter folder for tests/mlx_model.py's tiny Llama: mlx-lm's format (what mlx_lm.lora
    writes), or with `peft` the same weights as PEFT writes them (lora_A/lora_B transposed,
    scale as lora_alpha / r)."""
    import json

    from safetensors.numpy import save_file

    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    weights = {}
    for layer in range(layers):
        for key, (n_in, n_out) in MLX_TARGETS.items():
            n_in += 8 if wrong_shape else 0
            a = rng.normal(0, 0.2, (n_in, rank)).astype(np.float32)
            b = rng.normal(0, 0.2, (rank, n_out)).astype(np.float32)
            path = f"model.layers.{layer}.{key}"
            if peft:
                weights[f"base_model.model.{path}.lora_A.weight"] = np.ascontiguousarray(a.T)
                weights[f"base_model.model.{path}.lora_B.weight"] = np.ascontiguousarray(b.T)
            else:
                weights[f"{path}.lora_a"], weights[f"{path}.lora_b"] = a, b
    if peft:
        config = {
            "peft_type": "LORA",
            "r": rank,
            "lora_alpha": scale * rank,
            "target_modules": ["q_proj", "v_proj", "down_proj"],
        }
        save_file(weights, str(out / "adapter_model.safetensors"))
    else:
        parameters = {"rank": rank, "scale": scale, "dropout": 0.0, "keys": list(MLX_TARGETS)}
        config = {"fine_tune_type": "lora", "num_layers": layers, "lora_parameters": parameters}
        save_file(weights, str(out / "adapters.safetensors"))
    (out / "adapter_config.json").write_text(json.dumps(config))
    return out
