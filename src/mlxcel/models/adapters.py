"""A text model's LoRA adapters as the HTTP process serves them: llama-server's ids, vLLM's
names, each adapter's own scale and its global scale (GET/POST /lora-adapters). The table
belongs to the configured model, so adapters loaded at run time are loaded again when its
worker starts again."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from mlxcel.config.adapters import LoraAdapter
from mlxcel.config.settings import ModelConfig


@dataclass
class ServedAdapter:
    """One adapter: its id (never reused), what it is, and the scale requests that choose
    no adapter run it at."""

    id: int
    adapter: LoraAdapter
    global_scale: float

    @property
    def name(self) -> str:
        """Its name, for a request's `model` and vLLM's routes."""
        return self.adapter.name


class AdapterTable:
    """The adapters of one configured model."""

    def __init__(self, config: ModelConfig) -> None:
        applied = not config.lora_init_without_apply
        self._adapters = [
            ServedAdapter(i, a, a.scale if applied else 0.0)
            for i, a in enumerate(config.lora_adapters)
        ]
        self._next_id = len(self._adapters)

    def __iter__(self) -> Iterator[ServedAdapter]:
        return iter(list(self._adapters))

    def __len__(self) -> int:
        return len(self._adapters)

    def by_id(self, adapter_id: int) -> ServedAdapter | None:
        """The adapter with this id."""
        return next((a for a in self._adapters if a.id == adapter_id), None)

    def by_name(self, name: str) -> ServedAdapter | None:
        """The adapter with this name."""
        return next((a for a in self._adapters if a.name == name), None)

    def named_in(self, requested: str | None, bases: tuple[str, ...]) -> ServedAdapter | None:
        """The adapter a request's `model` names: `adapter` or `base:adapter`."""
        if not requested:
            return None
        for base in bases:
            if requested.startswith(f"{base}:"):
                return self.by_name(requested[len(base) + 1 :])
        return self.by_name(requested)

    def add(self, name: str, path: Path) -> ServedAdapter:
        """A new adapter, at scale 1, not applied globally (as vLLM's loaded adapters are)."""
        served = ServedAdapter(self._next_id, LoraAdapter(name, path), 0.0)
        self._next_id += 1
        self._adapters.append(served)
        return served

    def remove(self, name: str) -> None:
        """Forget an adapter."""
        self._adapters = [a for a in self._adapters if a.name != name]

    def set_global(self, scales: Mapping[int, float]) -> None:
        """llama-server's POST /lora-adapters: these ids at these scales, the others at 0."""
        for served in self._adapters:
            served.global_scale = scales.get(served.id, 0.0)

    def configured(self, config: ModelConfig) -> ModelConfig:
        """The model's config with the adapters it has now, for a worker that starts."""
        return replace(config, lora_adapters=tuple(a.adapter for a in self._adapters))
