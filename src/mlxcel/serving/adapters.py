"""Which LoRA adapters a request runs with, three ways (docs/lora.md): llama-server's `lora`
list (adapters it does not name run at scale 0; an empty list is exactly the base model), a
`model` naming an adapter (`adapter` or `base:adapter`, at the adapter's own scale), else the
global scales of GET/POST /lora-adapters."""

from __future__ import annotations

import math

from mlxcel.engine.adapters import AdapterSet, adapter_set
from mlxcel.models.adapters import AdapterTable
from mlxcel.protocol.common import LoraChoice
from mlxcel.protocol.errors import invalid_request


def chosen_scales(table: AdapterTable, choices: list[LoraChoice], param: str) -> dict[int, float]:
    """llama-server's [{id, scale}] as scales by id; a 400 naming `param` for an unknown id
    or a scale that is not a finite number."""
    scales: dict[int, float] = {}
    for index, choice in enumerate(choices):
        if table.by_id(choice.id) is None:
            known = ", ".join(str(a.id) for a in table) or "none"
            message = f"no LoRA adapter has id {choice.id} (loaded: {known}; GET /lora-adapters)"
            raise invalid_request(message, f"{param}[{index}].id")
        if not math.isfinite(choice.scale):
            raise invalid_request(
                f"the scale of adapter {choice.id} is not a finite number",
                f"{param}[{index}].scale",
            )
        scales[choice.id] = choice.scale
    return scales


def request_adapters(
    table: AdapterTable, lora: list[LoraChoice] | None, model: str | None, bases: tuple[str, ...]
) -> AdapterSet:
    """The adapter set a request runs with."""
    if lora is not None:
        scales = chosen_scales(table, lora, "lora")
        return adapter_set({a.name: scales.get(a.id, 0.0) for a in table})
    named = table.named_in(model, bases)
    if named is not None:
        return adapter_set({named.name: named.adapter.scale})
    base = next((b for b in bases if model and model.startswith(f"{b}:")), None)
    if base is not None and model is not None:
        adapter = model[len(base) + 1 :]
        known = ", ".join(a.name for a in table) or "none"
        message = f"the model '{base}' has no LoRA adapter '{adapter}' (loaded: {known})"
        raise invalid_request(message, "model", "model_not_found")
    return adapter_set({a.name: a.global_scale for a in table})
