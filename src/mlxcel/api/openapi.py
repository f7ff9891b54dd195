"""A truthful /openapi.json: what each route answers, in which envelope, and what it takes.

FastAPI's own document lists a 422 `HTTPValidationError` this server never sends, leaves the
JSON answers of the generation routes untyped, and lists request fields the field policy
always refuses. This one starts from it and then: gives each route the body of its 200 (and
the event stream where it streams), the error envelope for every other status it can answer,
the two ways to send the API key, and request models without the refused fields. With a key
set it is served behind the key, unless --public-openapi.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

from fastapi import Depends, FastAPI
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from pydantic import BaseModel

import mlxcel.protocol
from mlxcel.api.auth import require_api_key
from mlxcel.api.openapi_ollama import OLLAMA_ERROR, ollama_responses
from mlxcel.api.openapi_requests import (
    BINARY,
    add_forms,
    bound_prompts,
    keep_served,
    served_capabilities,
)
from mlxcel.api.routes.embeddings import RERANK_PATHS
from mlxcel.config.settings import ServerConfig
from mlxcel.models.loaded import Capability
from mlxcel.protocol.policy import Refused

_ANY: dict[str, Any] = {}


def _object(required: dict[str, Any], **optional: Any) -> dict[str, Any]:
    """An object with these fields (more may come: answers carry extensions)."""
    return {"type": "object", "required": list(required), "properties": {**required, **optional}}


_STRING = {"type": "string"}
_INT = {"type": "integer"}
_NULLABLE_STRING = {"type": ["string", "null"]}
_ARRAY = {"type": "array"}
_USAGE = _object({"prompt_tokens": _INT, "completion_tokens": _INT, "total_tokens": _INT})
MODEL = _object(
    {
        "id": _STRING,
        "object": {"const": "model"},
        "created": _INT,
        "owned_by": _STRING,
        "aliases": {"type": "array", "items": _STRING},
        "tags": {"type": "array", "items": _STRING},
        "capabilities": {"type": "array", "items": _STRING},
        "state": _STRING,
        "meta": {"type": "object"},
    }
)
CHAT = _object(
    {
        "id": _STRING,
        "object": {"const": "chat.completion"},
        "created": _INT,
        "model": _STRING,
        "choices": {
            "type": "array",
            "items": _object(
                {
                    "index": _INT,
                    "message": _object({"role": _STRING}, content=_NULLABLE_STRING),
                    "finish_reason": _NULLABLE_STRING,
                }
            ),
        },
        "usage": _USAGE,
    }
)
COMPLETION = _object(
    {
        "id": _STRING,
        "object": {"const": "text_completion"},
        "created": _INT,
        "model": _STRING,
        "choices": {
            "type": "array",
            "items": _object({"index": _INT, "text": _STRING, "finish_reason": _NULLABLE_STRING}),
        },
        "usage": _USAGE,
    }
)
RESPONSE = _object(
    {"id": _STRING, "object": {"const": "response"}, "status": _STRING, "model": _STRING},
    output=_ARRAY,
)
# No field is certain: `response_fields` keeps only those asked for, and none when none exist.
NATIVE = _object({}, content=_STRING, stop={"type": "boolean"}, model=_STRING)
MESSAGE = _object(
    {
        "id": _STRING,
        "type": {"const": "message"},
        "role": {"const": "assistant"},
        "model": _STRING,
        "content": _ARRAY,
        "stop_reason": _NULLABLE_STRING,
        "usage": _object({"input_tokens": _INT, "output_tokens": _INT}),
    }
)
# One server-sent event of a stream (`stream: true`): `data` is a JSON chunk of the route's
# API (or `[DONE]`); `event` names it on Responses and Messages streams.
SSE_EVENT = {
    **_object({"data": _STRING}, event=_STRING),
    "description": "one server-sent event; data holds a JSON chunk, or [DONE] at the end",
}
ERROR = _object(
    {
        "error": _object(
            {"message": _STRING, "type": _STRING},
            param=_NULLABLE_STRING,
            code=_NULLABLE_STRING,
        )
    }
)
ANTHROPIC_ERROR = _object(
    {"type": {"const": "error"}, "error": _object({"type": _STRING, "message": _STRING})}
)

EMBEDDINGS = _object(
    {
        "object": {"const": "list"},
        "data": {
            "type": "array",
            "items": _object({"object": {"const": "embedding"}, "index": _INT, "embedding": _ANY}),
        },
        "model": _STRING,
        "usage": _object({"prompt_tokens": _INT, "total_tokens": _INT}),
    }
)
NATIVE_EMBEDDINGS = {"type": "array", "items": _object({"index": _INT, "embedding": _ARRAY})}
RERANK = {
    "anyOf": [
        _object({"results": {"type": "array", "items": _object({"index": _INT})}}),
        {"type": "array", "items": _object({"index": _INT})},
    ]
}
_BINARY = {"schema": BINARY}
_TEXT = {"schema": _STRING}
# Answers in other media types than JSON, by (method, path), beside those _BODIES gives.
_OTHER_CONTENT: dict[tuple[str, str], dict[str, Any]] = {
    ("post", "/v1/audio/transcriptions"): {
        "text/plain": _TEXT,
        "application/x-subrip": _TEXT,
        "text/vtt": _TEXT,
    },
    ("post", "/v1/audio/translations"): {
        "text/plain": _TEXT,
        "application/x-subrip": _TEXT,
        "text/vtt": _TEXT,
    },
}
# Routes that never answer JSON: their 200's media types, and whether they also stream events.
_NOT_JSON: dict[tuple[str, str], tuple[dict[str, Any], bool]] = {
    # Speech answers audio, or events with stream_format "sse".
    ("post", "/v1/audio/speech"): ({"audio/*": _BINARY}, True),
    ("get", "/v1/images/files/{file_id}"): (
        {"image/png": _BINARY, "image/jpeg": _BINARY, "image/webp": _BINARY},
        False,
    ),
}
_IMAGE_ITEM = _object({}, b64_json=_STRING, url=_STRING, revised_prompt=_STRING)
IMAGES = _object(
    {
        "created": _INT,
        "data": {"type": "array", "items": _IMAGE_ITEM},
    },
    background=_STRING,
    output_format=_STRING,
    quality=_STRING,
    size=_STRING,
    usage=_object({"input_tokens": _INT, "output_tokens": _INT, "total_tokens": _INT}),
)
# (method, path) -> the 200 body, and whether the route also streams server-sent events.
_BODIES: dict[tuple[str, str], tuple[dict[str, Any], bool]] = {
    ("get", "/health"): (_object({"status": _STRING}), False),
    ("get", "/v1/health"): (_object({"status": _STRING}), False),
    ("get", "/v1/models"): (
        _object({"object": {"const": "list"}, "data": {"type": "array", "items": MODEL}}),
        False,
    ),
    ("get", "/v1/models/{model_id}"): (MODEL, False),
    ("post", "/v1/chat/completions"): (CHAT, True),
    ("post", "/v1/completions"): (COMPLETION, True),
    ("post", "/v1/responses"): (RESPONSE, True),
    ("get", "/v1/responses/{response_id}"): (RESPONSE, False),
    ("delete", "/v1/responses/{response_id}"): (
        _object({"id": _STRING, "object": _STRING, "deleted": {"type": "boolean"}}),
        False,
    ),
    ("post", "/models/load"): (MODEL, False),
    ("post", "/models/unload"): (MODEL, False),
    ("post", "/tokenize"): (_object({"tokens": _ARRAY}), False),
    ("post", "/detokenize"): (_object({"content": _STRING}), False),
    ("post", "/apply-template"): (_object({"prompt": _STRING}), False),
    ("get", "/props"): (_object({"default_generation_settings": {"type": "object"}}), False),
    ("post", "/v1/chat/completions/input_tokens"): (_object({"input_tokens": _INT}), False),
    ("post", "/completion"): ({"anyOf": [NATIVE, {"type": "array", "items": NATIVE}]}, True),
    ("post", "/infill"): ({"anyOf": [NATIVE, {"type": "array", "items": NATIVE}]}, True),
    ("post", "/v1/messages"): (MESSAGE, True),
    ("post", "/v1/messages/count_tokens"): (_object({"input_tokens": _INT}), False),
    ("get", "/slots"): ({"type": "array", "items": {"type": "object"}}, False),
    ("post", "/slots/{id_slot}"): (_object({"id_slot": _INT}), False),
    ("post", "/v1/embeddings"): (EMBEDDINGS, False),
    ("post", "/embedding"): (NATIVE_EMBEDDINGS, False),
    ("post", "/embeddings"): ({"anyOf": [EMBEDDINGS, NATIVE_EMBEDDINGS]}, False),
    **{("post", path): (RERANK, False) for path in (*RERANK_PATHS, "/v2/rerank")},
    ("post", "/v1/audio/transcriptions"): (_object({"text": _STRING}), True),
    ("post", "/v1/audio/translations"): (_object({"text": _STRING}), True),
    ("get", "/v1/audio/voices"): (
        _object({"object": {"const": "list"}, "data": {"type": "array"}}),
        False,
    ),
    ("post", "/v1/images/generations"): (IMAGES, True),
    ("post", "/v1/images/edits"): (IMAGES, True),
}
_PUBLIC = frozenset({"/health", "/v1/health"})
_REASONS = {
    400: "Invalid request: body, field, JSON, Unicode, Host header, or a limit passed",
    401: "Missing or wrong API key",
    403: "A browser request from an origin --cors-origins does not allow",
    404: "No model, response or route by that name",
    409: "The model is in use",
    413: "The body is larger than the server takes",
    500: "A slot file could not be written",
    501: "Slot actions need --slot-save-path, and a model whose KV state can be saved",
    503: "Loading, busy (queue full or waited too long: Retry-After), or a model unavailable",
}


def _statuses(method: str, path: str, secured: bool) -> list[int]:
    """Every status other than 200 the route can answer."""
    if path in _PUBLIC:
        return [400, 403, 503]
    statuses = [400, 401, 403, 404, 503] if secured else [400, 403, 404, 503]
    if method in ("post", "put"):
        statuses.append(413)
    if path in ("/models/unload", "/v1/unload_lora_adapter"):
        statuses.append(409)
    if path == "/slots/{id_slot}":
        statuses += [500, 501]
    return sorted(statuses)


def _responses(method: str, path: str, secured: bool, current: dict[str, Any]) -> dict[str, Any]:
    error_ref = "AnthropicError" if path.startswith("/v1/messages") else "Error"
    error = {"application/json": {"schema": {"$ref": f"#/components/schemas/{error_ref}"}}}
    responses: dict[str, Any] = {}
    ok = dict(current.get("200", {"description": "OK"}))
    if path == "/metrics":
        ok["content"] = {"text/plain": {"schema": {**_STRING, "description": "Prometheus text"}}}
    elif (method, path) in _NOT_JSON or (method, path) in _BODIES:
        if (method, path) in _NOT_JSON:
            content, streams = _NOT_JSON[(method, path)]
        else:
            body, streams = _BODIES[(method, path)]
            content = {
                "application/json": {"schema": body},
                **_OTHER_CONTENT.get((method, path), {}),
            }
        ok["content"] = dict(content)
        if streams:
            ok["content"]["text/event-stream"] = {"schema": SSE_EVENT}
    responses["200"] = ok
    for status in _statuses(method, path, secured):
        responses[str(status)] = {"description": _REASONS[status], "content": error}
    return responses


# Fields a request model declares that the route refuses unless left at their default (its
# code checks them, not a Refused mark): the document leaves them out.
_REFUSED_IN_CODE = {
    "ResponsesRequest": {"max_tokens", "n", "n_predict", "n_probs", "stream_options", "background"}
}


def _refused_fields() -> dict[str, set[str]]:
    """Request model name -> the fields it never takes: a Refused mark that lets only null
    through, and _REFUSED_IN_CODE."""
    refused = {model: set(fields) for model, fields in _REFUSED_IN_CODE.items()}
    for info in pkgutil.iter_modules(mlxcel.protocol.__path__):
        module = importlib.import_module(f"mlxcel.protocol.{info.name}")
        for value in vars(module).values():
            if not (isinstance(value, type) and issubclass(value, BaseModel)):
                continue
            for name, field in value.model_fields.items():
                if any(isinstance(m, Refused) and m.only_null for m in field.metadata):
                    refused.setdefault(value.__name__, set()).add(field.alias or name)
    return refused


def _drop_refused(schemas: dict[str, Any]) -> None:
    for model, fields in _refused_fields().items():
        for name in (model, f"{model}-Input"):
            schema = schemas.get(name)
            if schema is None:
                continue
            for field in fields:
                schema.get("properties", {}).pop(field, None)
            if "required" in schema:
                schema["required"] = [r for r in schema["required"] if r not in fields]


def openapi_document(
    app: FastAPI, secured: bool, capabilities: set[Capability], slot_files: bool = True
) -> dict[str, Any]:
    """The document, built from the app's routes, of the operations models with these
    capabilities serve; the slot actions only where a model has --slot-save-path (elsewhere
    they answer llama-server's 501, a server error)."""
    document = get_openapi(title=app.title, version=app.version, routes=app.routes)
    if not slot_files:
        document["paths"].pop("/slots/{id_slot}", None)
    schemas: dict[str, Any] = document.setdefault("components", {}).setdefault("schemas", {})
    for unused in ("HTTPValidationError", "ValidationError"):
        schemas.pop(unused, None)
    keep_served(document, capabilities)
    add_forms(document, schemas)
    bound_prompts(schemas)
    _drop_refused(schemas)
    schemas["Error"] = ERROR
    schemas["AnthropicError"] = ANTHROPIC_ERROR
    schemas["OllamaError"] = OLLAMA_ERROR
    document["components"]["securitySchemes"] = {
        "bearer": {"type": "http", "scheme": "bearer", "description": "Authorization: Bearer KEY"},
        "apiKey": {"type": "apiKey", "in": "header", "name": "X-Api-Key"},
    }
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            operation["responses"] = _responses(method, path, secured, operation["responses"])
            if path.startswith("/api/"):
                operation["responses"] = ollama_responses(method, path, operation["responses"])
            if secured and path not in _PUBLIC:
                operation["security"] = [{"bearer": []}, {"apiKey": []}]
    return document


def install_openapi(app: FastAPI, config: ServerConfig) -> None:
    """Serve the document at /openapi.json (create the app with openapi_url=None)."""
    secured = bool(config.api_keys)
    capabilities = served_capabilities(config.models)
    cached: list[dict[str, Any]] = []
    dependencies = [] if config.public_openapi else [Depends(require_api_key)]
    slot_files = any(model.slot_save_path is not None for model in config.models)

    @app.get("/openapi.json", include_in_schema=False, dependencies=dependencies)
    async def document() -> JSONResponse:
        if not cached:
            cached.append(openapi_document(app, secured, capabilities, slot_files))
        return JSONResponse(cached[0])
