"""Exceptions raised by the mlxcel client."""

from collections.abc import Mapping, Sequence


class MlxcelError(Exception):
    """Base class of every error the mlxcel client raises."""


def with_output(summary: str, output: Sequence[str]) -> str:
    """`summary`, followed by a managed server's last lines of output when there are any."""
    if not output:
        return summary
    shown = "\n".join(f"  {line}" for line in output)
    return f"{summary}; its last output:\n{shown}"


class ServerLaunchError(MlxcelError):
    """The managed server could not be started or did not become ready."""

    def __init__(self, summary: str, output: Sequence[str] = ()) -> None:
        self.output = list(output)
        super().__init__(with_output(summary, self.output))


class ServerStartupError(ServerLaunchError):
    """The managed server exited before it became ready."""

    def __init__(self, returncode: int, output: Sequence[str]) -> None:
        self.returncode = returncode
        super().__init__(f"mlxcel server exited with code {returncode} before it was ready", output)


class ServerTimeoutError(ServerLaunchError):
    """The managed server did not become ready within the startup timeout."""

    def __init__(self, timeout: float, output: Sequence[str]) -> None:
        self.timeout = timeout
        super().__init__(f"mlxcel server was not ready after {timeout:g} s and was stopped", output)


class APIError(MlxcelError):
    """A request to the server failed."""

    def __init__(
        self,
        message: str,
        *,
        error_type: str | None = None,
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        self.message = message
        self.error_type = error_type
        self.param = param
        self.code = code
        super().__init__(message)


class APIConnectionError(APIError):
    """The server could not be reached, or the connection broke.

    The message names the server's address; for a managed server also its pid, whether it is
    still running, and its last lines of output (`output`).
    """

    def __init__(self, message: str, output: Sequence[str] = ()) -> None:
        self.output = list(output)
        super().__init__(with_output(message, self.output))


class ServerExitedError(APIConnectionError):
    """The managed server exited: the message names its pid and exit status, and `output`
    holds its last lines of output."""

    def __init__(self, message: str, *, pid: int, returncode: int, output: Sequence[str]) -> None:
        self.pid = pid
        self.returncode = returncode
        super().__init__(message, output)


class APIStatusError(APIError):
    """The server answered with an HTTP error status."""

    def __init__(
        self,
        message: str,
        *,
        status_code: int,
        error_type: str | None = None,
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        self.status_code = status_code
        super().__init__(message, error_type=error_type, param=param, code=code)

    def __str__(self) -> str:
        return f"HTTP {self.status_code}: {self.message}"


class BadRequestError(APIStatusError):
    """HTTP 400: the request is invalid or unsupported."""


class AuthenticationError(APIStatusError):
    """HTTP 401: the API key is missing or wrong."""


class NotFoundError(APIStatusError):
    """HTTP 404: no such endpoint or model."""


class ServerError(APIStatusError):
    """HTTP 5xx: the server failed or is overloaded."""


_BY_STATUS: dict[int, type[APIStatusError]] = {
    400: BadRequestError,
    401: AuthenticationError,
    404: NotFoundError,
}


def _optional_str(value: object) -> str | None:
    return None if value is None else str(value)


def status_error(status_code: int, error: object) -> APIStatusError:
    """Build the error for an HTTP error status from the body's `error` object."""
    cls = _BY_STATUS.get(status_code, ServerError if status_code >= 500 else APIStatusError)
    if not isinstance(error, Mapping):
        return cls(str(error or "no error message"), status_code=status_code)
    return cls(
        str(error.get("message") or "no error message"),
        status_code=status_code,
        error_type=_optional_str(error.get("type")),
        param=_optional_str(error.get("param")),
        code=_optional_str(error.get("code")),
    )
