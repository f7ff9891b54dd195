"""LoRA adapters on MLX: mlx-lm adapter folders (adapter_config.json + adapters.safetensors)
and PEFT folders (adapter_config.json + adapter_model.safetensors), several loaded at once over
one model's weights, the applied set switched between steps.

A linear layer an adapter targets is wrapped once in `LoraLinear`, which adds each applied
adapter's `scale * (x @ a) @ b` to the base layer's output, the same operations in the same
order as mlx-lm's LoRALinear, so one adapter at scale 1 gives mlx-lm's own output. mlx-lm's
`load_adapters` instead replaces the layers with one adapter's, which is why its server
reloads the model to change adapters.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from mlxcel.engine.adapters import AdapterSet

Pair = tuple[mx.array, mx.array, float]
"""An adapter's (a, b, scale) for one layer: a is [in, rank], b is [rank, out]."""


@dataclass
class _Held:
    """What a wrapped layer holds beside its base: each adapter's pair, and those applied."""

    loaded: dict[str, Pair] = field(default_factory=dict)
    applied: list[Pair] = field(default_factory=list)


class LoraLinear(nn.Module):
    """A linear (or quantized linear) layer with LoRA adapters beside it."""

    def __init__(self, base: nn.Module) -> None:
        super().__init__()
        self.base = base
        self.held = _Held()  # not an array: MLX keeps it out of the parameters

    def dims(self) -> tuple[int, int]:
        """The base layer's input and output widths."""
        out_dims, in_dims = self.base.weight.shape
        if isinstance(self.base, nn.QuantizedLinear):
            in_dims = in_dims * 32 // self.base.bits
        return int(in_dims), int(out_dims)

    def __call__(self, x: mx.array) -> mx.array:
        y = self.base(x)
        for a, b, scale in self.held.applied:
            z = (x @ a) @ b
            y = y + (scale * z).astype(x.dtype)
        return y


def _weights(path: Path) -> dict[str, mx.array]:
    loaded = mx.load(str(path))
    if not isinstance(loaded, dict):
        raise ValueError(f"{path} is not a safetensors file of arrays")
    return loaded


def _mlx_lm_pairs(folder: Path, config: dict[str, Any]) -> dict[str, Pair]:
    kind = config.get("fine_tune_type", "lora")
    if kind != "lora":
        raise ValueError(f"a '{kind}' adapter: only LoRA adapters run over a loaded model")
    scale = float(config.get("lora_parameters", {}).get("scale", 20.0))
    weights = _weights(folder / "adapters.safetensors")
    return {
        key.removesuffix(".lora_a"): (a, weights[key.removesuffix("_a") + "_b"], scale)
        for key, a in weights.items()
        if key.endswith(".lora_a")
    }


def _peft_pairs(folder: Path, config: dict[str, Any]) -> dict[str, Pair]:
    if str(config.get("peft_type", "")).upper() != "LORA":
        raise ValueError(f"a PEFT '{config.get('peft_type')}' adapter: only LoRA runs here")
    rank = int(config["r"])
    alpha = float(config.get("lora_alpha", rank))
    scale = alpha / (math.sqrt(rank) if config.get("use_rslora") else rank)
    weights = _weights(folder / "adapter_model.safetensors")
    pairs = {}
    for key, a in weights.items():
        if key.endswith(".lora_A.weight"):
            module = key.removesuffix(".lora_A.weight").removeprefix("base_model.model.")
            b = weights[key.replace(".lora_A.", ".lora_B.")]
            pairs[module] = (a.T, b.T, scale)
    return pairs


def read_adapter(folder: Path) -> dict[str, Pair]:
    """An adapter folder's pairs by the path of the layer each targets; ValueError if it is
    not an adapter folder this reads."""
    config_file = folder / "adapter_config.json"
    if not config_file.is_file():
        raise ValueError(f"{folder} is not an adapter folder (no adapter_config.json)")
    config = json.loads(config_file.read_text())
    if (folder / "adapters.safetensors").is_file():
        pairs = _mlx_lm_pairs(folder, config)
    elif (folder / "adapter_model.safetensors").is_file():
        pairs = _peft_pairs(folder, config)
    else:
        raise ValueError(
            f"{folder} has no adapters.safetensors (mlx-lm) or adapter_model.safetensors (PEFT)"
        )
    if not pairs:
        raise ValueError(f"{folder} holds no LoRA weights")
    return pairs


def _wrapped(model: nn.Module, path: str, modules: dict[str, Any]) -> LoraLinear:
    """The layer at `path`, wrapped in a LoraLinear the first time; ValueError if the model
    has no linear layer there."""
    layer = modules.get(path)
    if isinstance(layer, LoraLinear):
        return layer
    if not isinstance(layer, (nn.Linear, nn.QuantizedLinear)):
        raise ValueError(f"the model has no linear layer '{path}'")
    parent_path, _, name = path.rpartition(".")
    wrapper = LoraLinear(layer)
    setattr(modules[parent_path] if parent_path else model, name, wrapper)
    modules[path] = wrapper
    return wrapper


class MlxAdapters:
    """The adapters over one MLX model; every MLX call goes through `call` (the generator's
    MLX thread)."""

    def __init__(self, model: Callable[[], nn.Module], call: Callable[..., Any]) -> None:
        self._model = model
        self._call = call
        self._layers: dict[str, LoraLinear] = {}
        self._names: set[str] = set()

    @property
    def names(self) -> frozenset[str]:
        return frozenset(self._names)

    def load(self, name: str, path: Path) -> None:
        if name in self._names:
            raise ValueError(f"a LoRA adapter named '{name}' is already loaded")
        try:
            self._call(self._load, name, path)
        except (ValueError, KeyError, OSError) as exc:
            raise ValueError(f"the LoRA adapter '{name}' ({path}) does not load: {exc}") from exc
        self._names.add(name)

    def _load(self, name: str, path: Path) -> None:
        pairs = read_adapter(path)
        model = self._model()
        modules = dict(model.named_modules())
        for target, (a, b, _) in pairs.items():
            layer = modules.get(target)
            base = layer.base if isinstance(layer, LoraLinear) else layer
            if not isinstance(base, (nn.Linear, nn.QuantizedLinear)):
                raise ValueError(f"the model has no linear layer '{target}'")
            in_dims, out_dims = LoraLinear(base).dims()
            if a.ndim != 2 or b.ndim != 2 or a.shape[0] != in_dims or b.shape[1] != out_dims:
                raise ValueError(
                    f"'{target}' is {in_dims}->{out_dims} in the model, "
                    f"{a.shape[0]}->{b.shape[-1]} in the adapter (built for another model?)"
                )
        for target, pair in pairs.items():
            layer = self._layers[target] = _wrapped(model, target, modules)
            layer.held.loaded[name] = pair
        mx.eval([[a, b] for a, b, _ in pairs.values()])

    def unload(self, name: str) -> None:
        self._names.discard(name)
        for layer in self._layers.values():
            pair = layer.held.loaded.pop(name, None)
            if pair is not None:
                layer.held.applied = [p for p in layer.held.applied if p[0] is not pair[0]]

    def apply(self, adapters: AdapterSet) -> None:
        for layer in self._layers.values():
            loaded = layer.held.loaded
            layer.held.applied = [
                (loaded[n][0], loaded[n][1], loaded[n][2] * s) for n, s in adapters if n in loaded
            ]
