"""Thin helpers over llama-cpp-python's ctypes API that its own wrappers get wrong or lack."""

from __future__ import annotations

import ctypes
from typing import Any

import llama_cpp
from llama_cpp import _logger as llama_logger


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


# llama-cpp-python's functions are ctypes.CDLL ones, which release the GIL for every call. On the
# engine thread that is a cost for short calls: the event loop takes the GIL during the call
# and the engine thread then waits for it, up to the interpreter's switch interval (5 ms),
# for every token it samples. The same symbols through a PyDLL keep the GIL: for calls far
# shorter than that wait (sampling, KV edits), never for llama_decode.
# On a model whose layers sit on RPC hosts none of this holds: reading logits waits on the
# network (and, over the keyed channel, on a relay thread in this process that needs the GIL).
_LIBRARY = llama_cpp.llama_cpp._lib
_HOLDING_GIL = ctypes.PyDLL(_LIBRARY._name, handle=_LIBRARY._handle)
_ALWAYS_RELEASE: list[bool] = [False]


def always_release_gil() -> None:
    """Make every `holding_gil` function release the GIL from now on, in this process."""
    _ALWAYS_RELEASE[0] = True


def holding_gil(name: str) -> Any:
    """llama.cpp's function `name`, called without releasing the GIL (unless
    `always_release_gil` was called)."""
    released = getattr(_LIBRARY, name)
    held = getattr(_HOLDING_GIL, name)
    held.argtypes, held.restype = released.argtypes, released.restype

    def call(*args: Any) -> Any:
        return (released if _ALWAYS_RELEASE[0] else held)(*args)

    return call


def put_token(batch: Any, index: int, token: int, pos: int, seq: int, logits: bool) -> None:
    """Set row `index` of a llama_batch: `token` at `pos` of sequence `seq`."""
    batch.token[index] = token
    batch.pos[index] = pos
    batch.n_seq_id[index] = 1
    batch.seq_id[index][0] = seq
    batch.logits[index] = logits
