"""One error envelope for every failure: {"error": {"message", "type", "param", "code"}}."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from mlxcel.engine.types import EngineError
from mlxcel.models.remote import WorkerGone
from mlxcel.protocol.errors import (
    APIError,
    field_error,
    invalid_request,
    model_unavailable,
    unavailable_now,
)

# Validation errors about a field or content part the server knows but does not do.
_UNSUPPORTED = ("unsupported_value", "unsupported_content_part")


def validation_error(exc: RequestValidationError) -> APIError:
    """A request body that failed validation, as a 400 naming the field."""
    errors = exc.errors()
    if not errors:
        return invalid_request("invalid request body")
    if errors[0].get("type") == "json_invalid":
        return invalid_request(f"the body is not valid JSON: {errors[0].get('msg', '')}")
    found = field_error(errors)
    param = found.path or None
    if found.kind == "extra_forbidden":
        return invalid_request(
            f"unsupported field '{param}'", param=param, code="unsupported_field"
        )
    where = f"'{param}': " if param else ""
    # What the field policy refuses (protocol/policy.py) is a field this server cannot do.
    code = "unsupported_field" if found.kind in _UNSUPPORTED else None
    return invalid_request(f"{where}{found.message}", param=param, code=code)


# The methods a 405's Allow may name.
_METHODS = ("DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT")


def allowed_methods(request: Request) -> str:
    """Every method some route serves at the request's path: Starlette's 405 names only the
    first route whose path matched (OPTIONS /models/load said GET, from /models/{model}).
    Each method is tried against the routes as the router would (included routers are not
    flattened, so their routes are not listed)."""
    routes = request.app.router.routes
    return ", ".join(
        method
        for method in _METHODS
        if any(
            route.matches({**request.scope, "method": method})[0] is Match.FULL for route in routes
        )
    )


def error_response(error: APIError) -> JSONResponse:
    """The envelope as an HTTP response."""
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


def install_error_handlers(app: FastAPI) -> None:
    """Route every error path through the envelope."""

    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(validation_error(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = exc.detail if isinstance(exc.detail, str) else "request failed"
        code = {404: "not_found", 413: "request_too_large"}.get(exc.status_code)
        headers = exc.headers
        if exc.status_code == 405:
            headers = {**(headers or {}), "Allow": allowed_methods(request)}
        return error_response(APIError(exc.status_code, message, code=code, headers=headers))

    @app.exception_handler(EngineError)
    async def _engine(_: Request, exc: EngineError) -> JSONResponse:
        # A call into a model's worker ended by the engine, past a route's own handling: the
        # shutdown timeout ending an embedding batch or a transcription.
        return error_response(unavailable_now(exc) or APIError(500, str(exc), code=exc.code))

    @app.exception_handler(WorkerGone)
    async def _worker_gone(_: Request, exc: WorkerGone) -> JSONResponse:
        # A call (tokenizing, an embedding batch, a transcription) reached a model whose worker
        # process had just died.
        return error_response(model_unavailable(f"{exc}; retry the request"))
