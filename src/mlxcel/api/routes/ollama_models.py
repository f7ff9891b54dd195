"""Ollama's model routes: GET /api/version, /api/tags, /api/ps, POST /api/show, and the model
management routes this server has no equivalent for, which answer what to do instead."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request

import mlxcel
from mlxcel.api.auth import require_api_key
from mlxcel.api.routes.ollama import OllamaRoute, served_name
from mlxcel.api.state import entry_for, loaded_registry, served_for
from mlxcel.protocol.errors import APIError, invalid_request
from mlxcel.protocol.ollama import ShowRequest
from mlxcel.serving.ollama_models import listed, running, shown

# The Ollama release whose API these routes follow: clients check it against their minimum.
OLLAMA_VERSION = "0.12.6"
# What each management route would do, and what to do here instead.
_MANAGEMENT = {
    "/api/push": ("uploading models", ["POST"]),
    "/api/create": ("creating models", ["POST"]),
    "/api/copy": ("copying models", ["POST"]),
    "/api/blobs/{digest}": ("uploading model files", ["HEAD", "POST"]),
}
_INSTEAD = (
    "serve a model by starting mlxcel with -m PATH_OR_HF_ID (a GGUF file, an MLX folder or a "
    "Hugging Face id, downloaded on start) or list several in --config; names and aliases come "
    "from --alias or the config's `name`"
)

router = APIRouter(route_class=OllamaRoute, dependencies=[Depends(require_api_key)])


@router.get("/api/version")
async def version() -> dict[str, str]:
    """The Ollama API version these routes follow, and this server's own."""
    return {"version": OLLAMA_VERSION, "mlxcel": str(mlxcel.__version__)}


@router.get("/api/tags")
async def tags(request: Request) -> dict[str, Any]:
    """Every served model, with details read from its weights."""
    return {"models": [listed(entry) for entry in loaded_registry(request).entries()]}


@router.get("/api/ps")
async def ps(request: Request) -> dict[str, Any]:
    """The loaded models, with when each will be unloaded if left idle."""
    entries = loaded_registry(request).entries()
    loaded = [e for e in entries if e.state == "loaded" and e.model is not None]
    return {"models": [running(e, 0 if e.config.pinned else e.idle_timeout) for e in loaded]}


@router.post("/api/show")
async def show(body: ShowRequest, request: Request) -> dict[str, Any]:
    """A model's details, template, parameters and capabilities; a text model is loaded
    first, since its template and context are read from the loaded model."""
    name = body.model or body.name
    if not name:
        raise invalid_request("'model' is required", "model")
    entry = entry_for(request, served_name(request, name), None)
    capability = entry.capabilities[0] if entry.capabilities else None
    model = await served_for(request, entry.name, capability) if capability else None
    return shown(entry, model)


def _unsupported(path: str, what: str) -> Any:
    async def route() -> None:
        # A 400 as for any request asking what this server does not do (not a 404: the route
        # is here, and the message says what to do instead).
        raise APIError(
            400,
            f"{what} through the Ollama API is not supported by mlxcel ({path}): {_INSTEAD}",
            code="unsupported_operation",
        )

    return route


for _path, (_what, _methods) in _MANAGEMENT.items():
    router.add_api_route(_path, _unsupported(_path, _what), methods=_methods)
