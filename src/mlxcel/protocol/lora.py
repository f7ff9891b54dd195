"""Bodies of the LoRA routes: vLLM's POST /v1/load_lora_adapter and /v1/unload_lora_adapter
(llama-server's POST /lora-adapters takes a list of `common.LoraChoice`)."""

from __future__ import annotations

from pydantic import Field

from mlxcel.protocol.policy import Strict


class LoadLoraAdapter(Strict):
    """An adapter to load over a text model (`model`; default: the first text model)."""

    lora_name: str = Field(min_length=1)
    lora_path: str = Field(min_length=1)
    model: str | None = None


class UnloadLoraAdapter(Strict):
    """An adapter to unload, by name (vLLM's `lora_int_id` is accepted and not needed)."""

    lora_name: str = Field(min_length=1)
    lora_int_id: int | None = None
    model: str | None = None
