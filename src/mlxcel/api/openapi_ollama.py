"""What /openapi.json says of Ollama's routes: their answers, NDJSON streams, and the error
shape {"error": "..."} on every other status they can answer (only 400 on the model management
this server does not do through them)."""

from __future__ import annotations

from typing import Any

_STRING = {"type": "string"}
_INT = {"type": "integer"}
_LIST = {"type": "array"}


def _object(required: dict[str, Any], **optional: Any) -> dict[str, Any]:
    return {"type": "object", "required": list(required), "properties": {**required, **optional}}


OLLAMA_ERROR = _object({"error": _STRING})
# A chat or generate answer, or one line of its stream: `done` says which.
_GENERATED = _object(
    {"model": _STRING, "created_at": _STRING, "done": {"type": "boolean"}},
    message=_object({"role": _STRING, "content": _STRING}),
    response=_STRING,
    done_reason=_STRING,
)
_NDJSON = {"schema": {**_STRING, "description": "one JSON object a line, the last with done: true"}}
_BODIES: dict[tuple[str, str], dict[str, Any]] = {
    ("get", "/api/version"): _object({"version": _STRING}),
    ("get", "/api/tags"): _object({"models": _LIST}),
    ("get", "/api/ps"): _object({"models": _LIST}),
    ("post", "/api/show"): _object({"details": {"type": "object"}, "capabilities": _LIST}),
    ("post", "/api/chat"): _GENERATED,
    ("post", "/api/generate"): _GENERATED,
    ("post", "/api/embed"): _object({"embeddings": _LIST}),
    ("post", "/api/embeddings"): _object({"embedding": _LIST}),
    # With --allow-downloads (docs/getting-models.md); a 400 without.
    ("post", "/api/pull"): _object({"status": _STRING}),
    ("delete", "/api/delete"): {"description": "no body"},
}
_STREAMS = {("post", "/api/chat"), ("post", "/api/generate"), ("post", "/api/pull")}


def ollama_responses(method: str, path: str, responses: dict[str, Any]) -> dict[str, Any]:
    """An Ollama route's responses: its 200 body, and Ollama's error shape for the rest."""
    error = {"application/json": {"schema": {"$ref": "#/components/schemas/OllamaError"}}}
    out: dict[str, Any] = {}
    for status, response in responses.items():
        out[status] = {**response, "content": error} if status != "200" else response
    body = _BODIES.get((method, path))
    if body is None:
        # Model management: never a 200 here; a 400 says what to do instead.
        del out["200"]
        return out
    content: dict[str, Any] = {"application/json": {"schema": body}}
    if (method, path) in _STREAMS:
        content["application/x-ndjson"] = _NDJSON
    out["200"] = {**out["200"], "content": content}
    return out
