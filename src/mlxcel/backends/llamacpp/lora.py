"""LoRA adapters on llama.cpp: GGUF adapters loaded over the model's weights while it runs,
and the set the context's next decodes apply.

llama.cpp keeps the applied adapters in the context, for every sequence of a decode alike,
and reserves its compute graph again after a change; so the engine steps one adapter set at
a time (engine/adapters.py)."""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import llama_cpp
from llama_cpp import _logger as llama_logger

from mlxcel.engine.adapters import AdapterSet


@contextmanager
def _errors_kept(lines: list[str]) -> Iterator[None]:
    """llama.cpp's log lines while inside (an adapter that does not load says why only
    there), the usual logger back after."""

    @llama_cpp.llama_log_callback  # type: ignore[untyped-decorator]
    def keep(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
        lines.append(text.decode("utf-8", errors="replace").strip())

    llama_cpp.llama_log_set(keep, ctypes.c_void_p(0))
    try:
        yield
    finally:
        llama_cpp.llama_log_set(llama_logger.llama_log_callback, ctypes.c_void_p(0))


def _reason(lines: list[str]) -> str:
    """The cause llama.cpp logged, without its function-name prefixes."""
    for line in reversed(lines):
        if "lora adapter:" in line:
            return line.rsplit("lora adapter:", 1)[1].strip()
    return "llama.cpp could not read it"


class LlamaAdapters:
    """The adapters loaded over one model, and the set its context applies."""

    def __init__(self, model: Any, ctx: Any) -> None:
        self._model = model
        self._ctx = ctx
        self._loaded: dict[str, Any] = {}
        self._applied: AdapterSet = ()

    @property
    def names(self) -> frozenset[str]:
        """The adapters loaded now."""
        return frozenset(self._loaded)

    def load(self, name: str, path: Path) -> None:
        """Load a GGUF adapter; ValueError says why one does not fit this model."""
        if name in self._loaded:
            raise ValueError(f"a LoRA adapter named '{name}' is already loaded")
        if not path.is_file():
            raise ValueError(f"the LoRA adapter '{name}': no file {path}")
        lines: list[str] = []
        with _errors_kept(lines):
            adapter = llama_cpp.llama_adapter_lora_init(self._model, str(path).encode())
        if not adapter:
            raise ValueError(f"the LoRA adapter '{name}' ({path}) does not load: {_reason(lines)}")
        self._loaded[name] = adapter

    def unload(self, name: str) -> None:
        """Free an adapter (taken out of the applied set first)."""
        adapter = self._loaded.pop(name)
        if any(applied == name for applied, _ in self._applied):
            self.apply(tuple(pair for pair in self._applied if pair[0] != name))
        llama_cpp.llama_adapter_lora_free(adapter)

    def apply(self, adapters: AdapterSet) -> None:
        """The set the context's next decodes run with."""
        n = len(adapters)
        pointers = (llama_cpp.llama_adapter_lora_p_ctypes * max(n, 1))(
            *(self._loaded[name] for name, _ in adapters)
        )
        scales = (ctypes.c_float * max(n, 1))(*(scale for _, scale in adapters))
        llama_cpp.llama_set_adapters_lora(self._ctx, pointers, n, scales)
        self._applied = adapters

    def close(self) -> None:
        """Free every adapter (before the model)."""
        for name in list(self._loaded):
            self.unload(name)
