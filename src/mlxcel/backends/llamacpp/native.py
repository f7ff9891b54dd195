"""Thin helpers over llama-cpp-python's ctypes API that its own wrappers get wrong or lack."""

from __future__ import annotations

import ctypes
from typing import Any

import llama_cpp
from llama_cpp import _logger as llama_logger

from mlxcel.engine.types import SamplingParams


def route_native_logs(verbose: bool) -> None:
    """Let llama.cpp's own load logs through only when debugging."""
    llama_logger.set_verbose(verbose)


def metadata_string(model: Any, key: str) -> str | None:
    """A GGUF metadata value as a string, or None when the key is absent."""
    size = 4096
    while True:
        buf = ctypes.create_string_buffer(size)
        n = llama_cpp.llama_model_meta_val_str(model, key.encode(), buf, size)
        if n < 0:
            return None
        if n < size:
            return buf.value.decode("utf-8", errors="replace")
        size = n + 1


def token_piece(vocab: Any, token: int, *, special: bool) -> bytes:
    """The bytes of one token."""
    buf = ctypes.create_string_buffer(64)
    n = llama_cpp.llama_token_to_piece(vocab, token, buf, 64, 0, special)
    if n < 0:
        buf = ctypes.create_string_buffer(-n)
        n = llama_cpp.llama_token_to_piece(vocab, token, buf, -n, 0, special)
    return buf.raw[:n]


def tokenize(vocab: Any, data: bytes, *, add_special: bool, parse_special: bool) -> list[int]:
    """Token ids for `data`, growing the buffer when llama.cpp asks for more room."""
    capacity = len(data) + 8
    while True:
        tokens = (llama_cpp.llama_token * capacity)()
        n = llama_cpp.llama_tokenize(
            vocab, data, len(data), tokens, capacity, add_special, parse_special
        )
        if n >= 0:
            return list(tokens[:n])
        capacity = -n


def build_sampler(vocab: Any, params: SamplingParams) -> Any:
    """A llama.cpp sampler chain for one request's parameters."""
    chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    add = llama_cpp.llama_sampler_chain_add
    if (params.repeat_penalty, params.frequency_penalty, params.presence_penalty) != (1.0, 0, 0):
        # The binding still declares a leading n_vocab that the C function no longer takes;
        # integers and floats travel in separate registers, so passing the window size in
        # both integer slots gives the C side the right value either way.
        penalties = llama_cpp.llama_sampler_init_penalties(
            params.repeat_last_n,
            params.repeat_last_n,
            params.repeat_penalty,
            params.frequency_penalty,
            params.presence_penalty,
        )
        add(chain, penalties)
    if params.temperature <= 0:
        add(chain, llama_cpp.llama_sampler_init_greedy())
        return chain
    if params.top_k > 0:
        add(chain, llama_cpp.llama_sampler_init_top_k(params.top_k))
    if params.top_p < 1.0:
        add(chain, llama_cpp.llama_sampler_init_top_p(params.top_p, 1))
    if params.min_p > 0.0:
        add(chain, llama_cpp.llama_sampler_init_min_p(params.min_p, 1))
    add(chain, llama_cpp.llama_sampler_init_temp(params.temperature))
    seed = llama_cpp.LLAMA_DEFAULT_SEED if params.seed is None else params.seed & 0xFFFFFFFF
    add(chain, llama_cpp.llama_sampler_init_dist(seed))
    return chain
