"""mlxcel: a local OpenAI-compatible inference server and its Python client."""

from typing import TYPE_CHECKING, Any

from mlxcel.errors import (
    APIConnectionError,
    APIError,
    APIStatusError,
    AuthenticationError,
    BadRequestError,
    MlxcelError,
    NotFoundError,
    ServerError,
    ServerExitedError,
    ServerLaunchError,
    ServerStartupError,
    ServerTimeoutError,
)

if TYPE_CHECKING:
    from mlxcel.client import LLM, AsyncLLM

    __version__: str

__all__ = [
    "LLM",
    "APIConnectionError",
    "APIError",
    "APIStatusError",
    "AsyncLLM",
    "AuthenticationError",
    "BadRequestError",
    "MlxcelError",
    "NotFoundError",
    "ServerError",
    "ServerExitedError",
    "ServerLaunchError",
    "ServerStartupError",
    "ServerTimeoutError",
]

_CLIENT_NAMES = frozenset({"LLM", "AsyncLLM"})
_DISTRIBUTION = "mlxcel"


def __getattr__(name: str) -> Any:
    if name == "__version__":
        # The installed package's metadata is the one place the version is written.
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version(_DISTRIBUTION)
        except PackageNotFoundError:
            return "0+unknown"
    # The client imports openai (most of a second); the server imports this package too.
    if name in _CLIENT_NAMES:
        from mlxcel import client

        return getattr(client, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
