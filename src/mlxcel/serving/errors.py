"""The error a request gets: an HTTP status and the OpenAI error envelope.

It knows nothing of the web framework: api/errors.py turns it into a response."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

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


def model_unavailable(message: str) -> APIError:
    """A 503 that says retry: the model's worker died under the request, or it cannot load."""
    return APIError(503, message, code="model_unavailable", headers={"Retry-After": "1"})
