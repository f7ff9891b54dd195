"""GET /health and /v1/health (public), GET /v1/models."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request

from mlxcel.api.auth import require_api_key
from mlxcel.api.state import loaded_registry
from mlxcel.serving.errors import APIError

public = APIRouter()
router = APIRouter(dependencies=[Depends(require_api_key)])


@public.get("/health")
@public.get("/v1/health")
async def health(request: Request) -> dict[str, str]:
    """200 once every model is loaded, 503 before."""
    if request.app.state.load_error is not None:
        raise APIError(503, f"model failed to load: {request.app.state.load_error}")
    if request.app.state.registry is None:
        raise APIError(503, "loading model", code="loading")
    return {"status": "ok"}


@router.get("/v1/models")
async def list_models(request: Request) -> dict[str, Any]:
    """The served models in OpenAI's list shape."""
    registry = loaded_registry(request)
    return {
        "object": "list",
        "data": [
            {
                "id": model.name,
                "object": "model",
                "created": request.app.state.started,
                "owned_by": "mlxcel",
                "meta": {"backend": model.backend, "path": str(model.path)},
            }
            for model in registry.all()
        ],
    }
