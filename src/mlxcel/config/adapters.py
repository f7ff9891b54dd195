"""LoRA adapters as configured: llama-server's --lora and --lora-scaled, a config file's
`lora_adapters` list, mlx-openai-server's `lora_paths` and `lora_scales`."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class LoraAdapter:
    """One adapter over a model: its name (a request's `model` may name it), where its
    weights are, and the scale it runs at when chosen by name or applied globally."""

    name: str
    path: Path
    scale: float = 1.0


def adapter_name(path: Path) -> str:
    """The name an adapter gets from its path: the file's stem, or the folder's name."""
    return path.stem if path.suffix == ".gguf" else path.name


def finite_scale(value: Any, what: str) -> float:
    """A scale as a float; ValueError naming `what` unless it is a finite number."""
    try:
        scale = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{what}: the scale {value!r} is not a number") from None
    if isinstance(value, bool) or not math.isfinite(scale):
        raise ValueError(f"{what}: the scale {value!r} is not a finite number")
    return scale


def from_flags(paths: Sequence[str], scaled: Sequence[str]) -> tuple[LoraAdapter, ...]:
    """--lora FILE[,FILE] and --lora-scaled FILE:SCALE[,FILE:SCALE] as adapters, each file
    checked to exist; ValueError names the first bad one."""
    adapters = [(Path(p), 1.0) for given in paths for p in given.split(",") if p]
    for given in scaled:
        for item in filter(None, given.split(",")):
            where, _, scale = item.rpartition(":")
            if not where:
                raise ValueError(f"--lora-scaled {item}: expected FILE:SCALE")
            adapters.append((Path(where), finite_scale(scale, f"--lora-scaled {item}")))
    return checked([LoraAdapter(adapter_name(p), p, s) for p, s in adapters])


def checked(adapters: Sequence[LoraAdapter]) -> tuple[LoraAdapter, ...]:
    """The adapters, each path existing and each name once; ValueError names the first bad."""
    seen: set[str] = set()
    for adapter in adapters:
        if not adapter.path.exists():
            raise ValueError(f"the LoRA adapter '{adapter.name}': no such file {adapter.path}")
        if adapter.name in seen:
            raise ValueError(f"two LoRA adapters are named '{adapter.name}'; name them apart")
        seen.add(adapter.name)
    return tuple(adapters)


def from_config(value: Any) -> tuple[LoraAdapter, ...]:
    """A config file's `lora_adapters: [{name, path, scale}]` (name defaults to the path's)."""
    if not isinstance(value, list):
        raise ValueError("expected a list of {name, path, scale}")
    adapters = []
    for item in value:
        if (
            not isinstance(item, dict)
            or "path" not in item
            or set(item) - {"name", "path", "scale"}
        ):
            raise ValueError(f"expected {{name, path, scale}} with a path, got {item!r}")
        path = Path(str(item["path"])).expanduser()
        name = str(item.get("name") or adapter_name(path))
        adapters.append(LoraAdapter(name, path, finite_scale(item.get("scale", 1.0), name)))
    return tuple(adapters)


def from_paths(value: Any) -> tuple[LoraAdapter, ...]:
    """mlx-openai-server's `lora_paths: [path, ...]`, each at scale 1 until `lora_scales`."""
    if not isinstance(value, list) or not all(isinstance(p, str) for p in value):
        raise ValueError("expected a list of paths")
    return tuple(LoraAdapter(adapter_name(Path(p)), Path(p).expanduser()) for p in value)


def located(adapters: Sequence[LoraAdapter], folder: Path) -> tuple[LoraAdapter, ...]:
    """A config file's adapters, a relative path read beside the file when it is there, each
    checked as `checked` does."""
    found = [
        replace(a, path=folder / a.path)
        if not a.path.is_absolute() and (folder / a.path).exists()
        else a
        for a in adapters
    ]
    return checked(found)


def scales(value: Any) -> tuple[float, ...]:
    """mlx-openai-server's `lora_scales: [scale, ...]`, one per path of `lora_paths`."""
    if not isinstance(value, list):
        raise ValueError("expected a list of numbers")
    return tuple(finite_scale(v, "lora_scales") for v in value)


def scaled(adapters: Sequence[LoraAdapter], given: Sequence[float]) -> tuple[LoraAdapter, ...]:
    """`lora_scales` applied to `lora_paths`' adapters, in order; the counts must agree."""
    if len(given) != len(adapters):
        raise ValueError(f"lora_scales has {len(given)} scales for {len(adapters)} lora_paths")
    return tuple(replace(a, scale=s) for a, s in zip(adapters, given, strict=True))
