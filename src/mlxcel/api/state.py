"""What routes read from the app: the registry once start-up is done, and the model a request
names, held for the request's whole life (streaming included)."""

from __future__ import annotations

import math
from collections.abc import Callable

from starlette.requests import HTTPConnection
from starlette.types import ASGIApp, Receive, Scope, Send

from mlxcel.logs import current_request
from mlxcel.models.entry import MissingCapability, ModelEntry, ModelNotFound, ModelUnavailable
from mlxcel.models.images import ImageModel
from mlxcel.models.loaded import TEXT, Capability, Loaded, LoadedEncoder, LoadedModel
from mlxcel.models.registry import ModelRegistry
from mlxcel.protocol.errors import APIError, model_unavailable

_LEASES = "model_leases"


def loaded_registry(request: HTTPConnection) -> ModelRegistry:
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


def entry_for(
    request: HTTPConnection, name: str | None, capability: Capability | None = TEXT
) -> ModelEntry:
    """The configured model a request names: 404 if none by that name, 400 if it cannot do
    what the route does (`capability`; None: any model, by its name only)."""
    record = current_request()
    if record is not None and capability is not None:
        record.model = name or "default"
    registry = loaded_registry(request)
    try:
        entry = (
            registry.named(name or "") if capability is None else registry.find(name, capability)
        )
    except ModelNotFound as exc:
        raise APIError(404, str(exc), param="model", code="model_not_found") from exc
    except MissingCapability as exc:
        raise invalid_model(str(exc)) from exc
    if record is not None and capability is not None:
        record.model = entry.name
    return entry


def invalid_model(message: str) -> APIError:
    """A 400: the model named cannot serve this route."""
    return APIError(400, message, param="model", code="model_not_supported")


def unavailable(exc: ModelUnavailable) -> APIError:
    """A 503: the model failed to load or took too long; Retry-After says when it may
    restart where that is known (past its bounded restarts: up to a minute, not 1 s)."""
    wait = 1 if exc.retry_after is None else max(1, math.ceil(exc.retry_after))
    return model_unavailable(str(exc), retry_after=wait)


async def model_for(
    request: HTTPConnection, name: str | None, capability: Capability = TEXT
) -> LoadedModel:
    """The loaded text model a request names, loaded first if need be, held until the
    response has been sent."""
    model = await served_for(request, name, capability)
    if not isinstance(model, LoadedModel):
        raise invalid_model(f"the model '{model.name}' does not generate text")
    return model


async def encoder_for(
    request: HTTPConnection, name: str | None, capability: Capability
) -> LoadedEncoder:
    """The loaded embedding or rerank model a request names, held as `model_for` holds one."""
    model = await served_for(request, name, capability)
    if not isinstance(model, LoadedEncoder):
        raise invalid_model(f"the model '{model.name}' cannot do {capability}")
    return model


async def image_model_for(
    request: HTTPConnection, name: str | None, capability: Capability
) -> ImageModel:
    """The loaded image model a request names, held as `model_for` holds one."""
    model = await served_for(request, name, capability)
    if not isinstance(model, ImageModel):
        raise invalid_model(f"the model '{model.name}' does not draw images")
    return model


async def served_for(request: HTTPConnection, name: str | None, capability: Capability) -> Loaded:
    """The loaded model of any kind a request names, held until the response has been sent."""
    entry = entry_for(request, name, capability)
    registry = loaded_registry(request)
    try:
        model = await registry.acquire(entry)
    except ModelUnavailable as exc:
        raise unavailable(exc) from exc
    leases: list[Callable[[], None]] = request.scope["state"][_LEASES]
    leases.append(lambda: registry.release(entry))
    return model


class HoldModels:
    """ASGI middleware: release the models a request used once its response is sent (a
    WebSocket's, once it closes)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        leases: list[Callable[[], None]] = []
        scope.setdefault("state", {})[_LEASES] = leases
        try:
            await self.app(scope, receive, send)
        finally:
            for release in leases:
                release()
