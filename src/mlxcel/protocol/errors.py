"""The error a request gets: an HTTP status and the OpenAI error envelope.

It knows nothing of the web framework: api/errors.py turns it into a response."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mlxcel.engine.types import EngineError

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    409: "invalid_request_error",
    413: "invalid_request_error",
    500: "server_error",
    503: "unavailable_error",
}


class APIError(Exception):
    """An error to answer with its HTTP status, in the OpenAI envelope."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str | None = None,
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type or _TYPES.get(status, "server_error")
        self.param = param
        self.code = code
        self.headers = headers

    def body(self) -> dict[str, Any]:
        """The envelope."""
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


def invalid_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    """A 400 about the request body."""
    return APIError(400, message, param=param, code=code)


def server_busy(message: str) -> APIError:
    """A 503: the queue is full, or a request waited too long in it; retry shortly."""
    return APIError(
        503, message, type="server_busy", code="server_busy", headers={"Retry-After": "1"}
    )


def shutting_down(message: str) -> APIError:
    """A 503: the server stopped the work in flight as it shuts down."""
    return APIError(503, message, code="shutting_down")


def model_unavailable(message: str, retry_after: int = 1) -> APIError:
    """A 503 that says retry (after `retry_after` seconds): the model's worker died under the
    request, or it cannot load."""
    return APIError(
        503, message, code="model_unavailable", headers={"Retry-After": str(retry_after)}
    )


def unavailable_now(error: EngineError) -> APIError | None:
    """The 503 an engine's error means when it says the work cannot go on now (the server
    is shutting down, the queue is full, the model's worker is gone); None for other errors."""
    helper = {
        "shutting_down": shutting_down,
        "server_busy": server_busy,
        "model_unavailable": model_unavailable,
    }.get(error.code)
    return helper(str(error)) if helper is not None else None


def refused(error: EngineError, param: str) -> APIError:
    """A 400 for an engine that refused a request's prompt: naming the field the error names
    (an image that does not decode), else `param`, the prompt's own."""
    if error.param is not None:
        return invalid_request(str(error), error.param, error.code)
    return invalid_request(str(error), param)


# Builtin types pydantic names a union's member by, in an error's location.
_TYPE_NAMES = frozenset({"str", "int", "float", "bool", "bytes", "list", "dict", "none"})


@dataclass(frozen=True)
class FieldError:
    """What pydantic found wrong with a body, said once: the field's path, what was wanted,
    and pydantic's error type."""

    path: str
    message: str
    kind: str


def _member(part: object) -> bool:
    """Whether a part of an error's location names a member of a union, not a field: pydantic
    writes the member's type there ('str', 'list[str]', "literal['none','auto']", a model's
    class name), which the client never sent."""
    return isinstance(part, str) and (
        part in _TYPE_NAMES or part[:1].isupper() or any(c in part for c in "[-'")
    )


def field_error(errors: Sequence[Mapping[str, Any]]) -> FieldError:
    """The first of pydantic's errors about a body (not empty), by the field's path as the
    client wrote it. A value that matched no member of a union gets an error per member: the
    one that got furthest into the value says what is wrong ('voice.id' of `{"id": 5}`);
    where none got past the union, what each wanted ("a valid string or a valid list" for a
    `stop` of 5), not the first member's alone under a path such as 'stop.str'."""

    def location(error: Mapping[str, Any]) -> list[Any]:
        parts = list(error.get("loc", ()))
        return parts[1:] if parts[:1] == ["body"] else parts  # FastAPI's own prefix

    def path(error: Mapping[str, Any]) -> list[Any]:
        return [part for part in location(error) if not _member(part)]

    chosen = [errors[0]]
    first = location(errors[0])
    at = next((i for i, part in enumerate(first) if _member(part)), None)
    if at is not None:
        members = [
            e
            for e in errors
            if location(e)[:at] == first[:at] and len(location(e)) > at and _member(location(e)[at])
        ]
        depth = max(len(location(e)) for e in members)
        deepest = [e for e in members if len(location(e)) == depth]
        chosen = [e for e in deepest if path(e) == path(deepest[0])]
    said = list(dict.fromkeys(str(e.get("msg", "invalid value")) for e in chosen))
    message = said[0] + "".join(f" or {m.removeprefix('Input should be ')}" for m in said[1:])
    return FieldError(
        ".".join(str(part) for part in path(chosen[0])), message, str(chosen[0].get("type", ""))
    )
