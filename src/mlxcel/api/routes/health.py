"""GET /health and /v1/health (public)."""

from __future__ import annotations

from fastapi import APIRouter, Request

from mlxcel.models.registry import ModelRegistry
from mlxcel.protocol.errors import APIError

public = APIRouter()


@public.get("/health")
@public.get("/v1/health")
async def health(request: Request) -> dict[str, str | int]:
    """503 until every model that loads at startup is loaded; then 200, `ok`, or `degraded`
    with how many models have failed (a crashed or unresponsive worker; each starts again on
    its next request, so the server stays in rotation; which ones and why is in the
    authenticated `/v1/models`)."""
    if request.app.state.load_error is not None:
        raise APIError(503, f"model failed to load: {request.app.state.load_error}")
    registry: ModelRegistry | None = request.app.state.registry
    if registry is None:
        raise APIError(503, "loading model", code="loading")
    failed = sum(entry.state == "failed" for entry in registry.entries())
    if failed:
        return {"status": "degraded", "failed_models": failed}
    return {"status": "ok"}
