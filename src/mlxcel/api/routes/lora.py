"""LoRA adapters at run time: llama-server's GET/POST /lora-adapters (ids and global scales)
and vLLM's POST /v1/load_lora_adapter and /v1/unload_lora_adapter. Loading one never reloads
the base weights; unloading one that running or waiting requests use answers 409."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import PlainTextResponse

from mlxcel.api.auth import require_api_key
from mlxcel.api.body_check import CheckedJsonRoute
from mlxcel.api.state import model_for
from mlxcel.engine.types import EngineError
from mlxcel.models.entry import ModelEntry
from mlxcel.models.loaded import LoadedModel
from mlxcel.protocol.common import LoraChoice
from mlxcel.protocol.errors import APIError, invalid_request
from mlxcel.protocol.lora import LoadLoraAdapter, UnloadLoraAdapter
from mlxcel.serving.adapters import chosen_scales

router = APIRouter(route_class=CheckedJsonRoute, dependencies=[Depends(require_api_key)])


def listed(model: LoadedModel) -> list[dict[str, Any]]:
    """llama-server's GET /lora-adapters list, with each adapter's name."""
    return [
        {
            "id": a.id,
            "name": a.name,
            "path": str(a.adapter.path),
            "scale": a.global_scale,
            "task_name": "",
            "prompt_prefix": "",
        }
        for a in model.adapters
    ]


def adapter_models(entry: ModelEntry, base: dict[str, Any]) -> list[dict[str, Any]]:
    """Each adapter of a model as /v1/models lists it, beside its base (vLLM's `parent`)."""
    return [
        {**base, "id": a.name, "aliases": [], "parent": entry.name, "root": entry.name}
        for a in entry.adapters
    ]


@router.get("/lora-adapters")
async def get_adapters(request: Request, model: str | None = None) -> list[dict[str, Any]]:
    """The adapters of a text model (`?model=`; default: the first)."""
    return listed(await model_for(request, model))


@router.post("/lora-adapters")
async def set_adapters(
    body: list[LoraChoice], request: Request, model: str | None = None
) -> dict[str, Any]:
    """Set the global scales: the adapters listed at theirs, the others at 0."""
    loaded = await model_for(request, model)
    loaded.adapters.set_global(chosen_scales(loaded.adapters, body, "body"))
    return {"success": True}


def _engine_error(exc: EngineError) -> APIError:
    status = 409 if exc.code == "adapter_in_use" else 400
    return APIError(status, str(exc), param=exc.param, code=exc.code)


@router.post("/v1/load_lora_adapter", response_class=PlainTextResponse)
async def load_adapter(body: LoadLoraAdapter, request: Request) -> str:
    """Load an adapter over the model's weights (which stay loaded as they are)."""
    loaded = await model_for(request, body.model)
    name, path = body.lora_name, Path(body.lora_path).expanduser()
    if loaded.adapters.by_name(name) is not None or name in loaded.names:
        raise invalid_request(f"the name '{name}' is taken on this model", "lora_name")
    if not path.exists():
        raise invalid_request(f"no such file or folder: {path}", "lora_path")
    try:
        await asyncio.to_thread(loaded.worker.call, "load_adapter", name, str(path.resolve()))
    except EngineError as exc:
        raise _engine_error(exc) from exc
    loaded.adapters.add(name, path.resolve())
    return f"Success: LoRA adapter '{name}' added successfully."


@router.post("/v1/unload_lora_adapter", response_class=PlainTextResponse)
async def unload_adapter(body: UnloadLoraAdapter, request: Request) -> str:
    """Unload an adapter; 409 while requests run or wait with it."""
    loaded = await model_for(request, body.model)
    name = body.lora_name
    if loaded.adapters.by_name(name) is None:
        raise invalid_request(f"no LoRA adapter '{name}' is loaded on this model", "lora_name")
    try:
        await asyncio.to_thread(loaded.worker.call, "unload_adapter", name)
    except EngineError as exc:
        raise _engine_error(exc) from exc
    loaded.adapters.remove(name)
    return f"Success: LoRA adapter '{name}' removed successfully."
