"""KV cache data types (-ctk/-ctv) and how much memory a context's KV cache takes."""

from __future__ import annotations

from typing import Any

import llama_cpp

from mlxcel.backends.llamacpp import native
from mlxcel.engine.capabilities import KvCacheInfo

# llama.cpp's KV cache types (common/arg.cpp's kv_cache_types), by ggml's names: the ggml type
# (ggml.h's enum ggml_type, which llama-cpp-python only partly mirrors), and how it stores a
# row (elements per block, bytes per block; ggml's type traits).
KV_TYPES: dict[str, tuple[int, int, int]] = {
    "f32": (0, 1, 4),
    "f16": (1, 1, 2),
    "q4_0": (2, 32, 18),
    "q4_1": (3, 32, 20),
    "q5_0": (6, 32, 22),
    "q5_1": (7, 32, 24),
    "q8_0": (8, 32, 34),
    "iq4_nl": (20, 32, 18),
    "bf16": (30, 1, 2),
}


def ggml_type(name: str) -> int:
    """The ggml type of a KV cache type name."""
    return KV_TYPES[name][0]


def _row_bytes(name: str, elements: int) -> int:
    _, block, size = KV_TYPES[name]
    return elements // block * size


def _head_dim(model: Any, which: str) -> int:
    """Elements per head of K or V: the GGUF's attention.key_length / value_length, else the
    embedding split evenly over the heads."""
    arch = native.metadata_string(model, "general.architecture") or ""
    given = native.metadata_string(model, f"{arch}.attention.{which}_length")
    if given is not None and given.isdigit():
        return int(given)
    return int(llama_cpp.llama_model_n_embd(model)) // int(llama_cpp.llama_model_n_head(model))


def kv_cache_info(model: Any, cells: int, type_k: str, type_v: str) -> KvCacheInfo:
    """What the KV cache of `cells` tokens (every sequence's together) holds, as llama.cpp
    allocates it for a model whose layers all attend over the whole context."""
    layers = int(llama_cpp.llama_model_n_layer(model))
    heads = int(llama_cpp.llama_model_n_head_kv(model))
    k_bytes = cells * layers * _row_bytes(type_k, heads * _head_dim(model, "key"))
    v_bytes = cells * layers * _row_bytes(type_v, heads * _head_dim(model, "value"))
    return KvCacheInfo(type_k, type_v, cells, k_bytes, v_bytes)
