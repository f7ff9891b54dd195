"""GET /models and /models/{id} (under /v1 and without: every configured model, its
capabilities and state), and llama-server's router routes POST /models/load and /models/unload."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from fastapi import APIRouter, Depends, Request

from mlxcel.api.auth import require_api_key
from mlxcel.api.body_check import CheckedJsonRoute
from mlxcel.api.routes.lora import adapter_models
from mlxcel.api.routes.pulls import added
from mlxcel.api.state import entry_for, loaded_registry, unavailable
from mlxcel.backends.group import describe
from mlxcel.config.engines import backend_label
from mlxcel.models.entry import ModelBusy, ModelEntry, ModelUnavailable
from mlxcel.protocol.errors import APIError, invalid_request
from mlxcel.protocol.models import ModelAction
from mlxcel.serving.native import device_split

listing = APIRouter(route_class=CheckedJsonRoute, dependencies=[Depends(require_api_key)])
router = APIRouter(route_class=CheckedJsonRoute, dependencies=[Depends(require_api_key)])


def _listed(entry: ModelEntry, request: Request) -> dict[str, Any]:
    """One model as listed. Its path on disk only with an API key set (docs/security.md): on
    an open server anything that reaches it (a page --cors-origins allows) would read it."""
    config = entry.config
    meta: dict[str, Any] = {
        "backend": backend_label(config),
        "memory_bytes": entry.size,
        "pid": entry.pid,
        "requests": entry.leases,
    }
    if request.app.state.api_keys:
        meta["path"] = str(config.model)
    meta.update(device_split(getattr(entry.model, "generator", None)))
    if config.distributed is not None:
        meta["distributed"] = describe(config.distributed)
    replicas = entry.replicas()
    if replicas is not None:
        meta["threads_per_replica"], meta["replicas"] = replicas
    if entry.on_ray:
        # Its replicas' memory is on the cluster's nodes: not measured, not in --max-memory.
        meta["placement"] = "ray"
        meta["in_memory_budget"] = False
    listed: dict[str, Any] = {
        "id": entry.name,
        "object": "model",
        "created": request.app.state.started,
        "owned_by": "mlxcel",
        "aliases": list(config.given_names),
        "tags": list(config.tags),
        "capabilities": list(entry.capabilities),
        "input_modalities": list(config.input_modalities),
        "state": entry.state,
        "meta": meta,
    }
    if config.kind == "embedding":
        listed["multi_vector"] = config.multi_vector
    if entry.reason is not None:
        listed["reason"] = entry.reason
    return listed


def _anthropic(entry: ModelEntry, request: Request) -> dict[str, Any]:
    """One model in Anthropic's shape, for its SDK (which sends `anthropic-version`)."""
    started = datetime.fromtimestamp(request.app.state.started, timezone.utc)
    return {
        "type": "model",
        "id": entry.name,
        "display_name": entry.name,
        "created_at": started.isoformat().replace("+00:00", "Z"),
    }


def _from_anthropic(request: Request) -> bool:
    return "anthropic-version" in request.headers


@listing.get("/models")
async def list_models(request: Request) -> dict[str, Any]:
    """The configured models in OpenAI's list shape, with their capabilities and state; in
    Anthropic's for its SDK."""
    entries = loaded_registry(request).entries()
    if _from_anthropic(request):
        data = [_anthropic(e, request) for e in entries]
        ids = [model["id"] for model in data]
        first, last = (ids[0], ids[-1]) if ids else (None, None)
        return {"data": data, "has_more": False, "first_id": first, "last_id": last}
    data = []
    for entry in entries:
        listed = _listed(entry, request)
        data += [listed, *adapter_models(entry, listed)]
    return {"object": "list", "data": data}


@listing.get("/models/{model_id:path}")
async def retrieve_model(model_id: str, request: Request) -> dict[str, Any]:
    """One configured model by any of its names (hub ids hold a slash) or `default`; 404 for
    other names."""
    entry = entry_for(request, model_id, None)
    return _anthropic(entry, request) if _from_anthropic(request) else _listed(entry, request)


@router.post("/models/load")
async def load(body: ModelAction, request: Request) -> dict[str, Any]:
    """Load a model now (nothing to do if it is loaded); with a `path`, first add the model on
    disk there under the name `model` (a pulled model, without a restart)."""
    if body.path is not None:
        await added(request, body.model, body.path)
    entry = entry_for(request, body.model, None)
    try:
        await loaded_registry(request).load(entry)
    except ModelUnavailable as exc:
        raise unavailable(exc) from exc
    return {"success": True, **_listed(entry, request)}


@router.post("/models/unload")
async def unload(body: ModelAction, request: Request) -> dict[str, Any]:
    """Unload a model now, ending its engine; 409 while requests hold it."""
    if body.path is not None:
        raise invalid_request("'path' is for POST /models/load", "path")
    entry = entry_for(request, body.model, None)
    try:
        await loaded_registry(request).unload(entry)
    except ModelBusy as exc:
        raise APIError(409, str(exc), param="model", code="model_busy") from exc
    return {"success": True, **_listed(entry, request)}
