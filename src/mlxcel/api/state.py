"""What routes read from the app: the registry once loading is done, and settings."""

from __future__ import annotations

from fastapi import Request

from mlxcel.engine.registry import LoadedModel, ModelNotFound, ModelRegistry
from mlxcel.logs import current_request
from mlxcel.serving.errors import APIError


def loaded_registry(request: Request) -> ModelRegistry:
    """The registry, or 503 while the models load."""
    registry: ModelRegistry | None = request.app.state.registry
    if registry is None:
        raise APIError(
            503,
            "the model is still loading; retry shortly",
            code="loading",
            headers={"Retry-After": "1"},
        )
    return registry


def model_for(request: Request, name: str | None) -> LoadedModel:
    """The model a request names: 404 model_not_found if there is none by that name."""
    record = current_request()
    if record is not None:
        record.model = name or "default"
    try:
        model = loaded_registry(request).get(name)
    except ModelNotFound as exc:
        raise APIError(404, str(exc), param="model", code="model_not_found") from exc
    if record is not None:
        record.model = model.name
    return model
