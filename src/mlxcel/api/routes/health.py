"""GET /health and /v1/health (public)."""

from __future__ import annotations

from fastapi import APIRouter, Request

from mlxcel.protocol.errors import APIError

public = APIRouter()


@public.get("/health")
@public.get("/v1/health")
async def health(request: Request) -> dict[str, str]:
    """200 once every model that loads at startup is loaded, 503 before."""
    if request.app.state.load_error is not None:
        raise APIError(503, f"model failed to load: {request.app.state.load_error}")
    if request.app.state.registry is None:
        raise APIError(503, "loading model", code="loading")
    return {"status": "ok"}
