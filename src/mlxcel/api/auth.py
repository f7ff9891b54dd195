"""API keys: Bearer or X-Api-Key, compared in constant time."""

from __future__ import annotations

import hmac

from fastapi import Request
from starlette.requests import HTTPConnection

from mlxcel.protocol.errors import APIError


def presented_key(request: HTTPConnection) -> str | None:
    """The key a request carries, if any."""
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return request.headers.get("x-api-key")


async def require_api_key(request: Request) -> None:
    """Dependency: reject the request unless it carries one of the server's keys."""
    keys: tuple[str, ...] = request.app.state.api_keys
    if not keys:
        return
    key = presented_key(request)
    if key is None:
        raise APIError(
            401, "missing API key: send 'Authorization: Bearer KEY'", code="invalid_api_key"
        )
    if not any(hmac.compare_digest(key.encode(), k.encode()) for k in keys):
        raise APIError(401, "invalid API key", code="invalid_api_key")
