"""Where a server listens, and the HTTP and OpenAI clients that reach it."""

import importlib
from dataclasses import dataclass
from functools import cache
from types import ModuleType
from typing import Any

import httpx
import openai

from mlxcel.errors import MlxcelError, status_error

# The SDK insists on a key; a server started without --api-key ignores whatever is sent.
NO_API_KEY = "not-needed"
HEALTH_PROBE_TIMEOUT_S = 2.0
REQUEST_TIMEOUT_S = 30.0


@cache
def openai_http_library() -> ModuleType:
    """Return the HTTP library (httpx2 for openai 3.x, httpx before) the openai SDK is built on."""
    for base in openai.DefaultHttpxClient.__mro__:
        if not base.__module__.startswith("openai"):
            return importlib.import_module(base.__module__.partition(".")[0])
    raise MlxcelError("cannot tell which HTTP library the installed openai SDK uses")


@dataclass(frozen=True)
class Endpoint:
    """How to reach one server: its root URL, an optional Unix socket and API key."""

    root_url: str
    uds: str | None = None
    api_key: str | None = None
    # Managed servers and sockets are local by construction, so proxy settings must not apply.
    local: bool = False

    @property
    def base_url(self) -> str:
        """The OpenAI-style base URL, ending in /v1."""
        return f"{self.root_url}/v1"

    @property
    def target(self) -> str:
        """Where the server is, for messages: its Unix socket's path, or its base URL."""
        return f"unix socket {self.uds}" if self.uds else self.base_url

    def http_client(self, timeout: float = REQUEST_TIMEOUT_S) -> httpx.Client:
        """Return a plain httpx client for the server root, authenticated."""
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        transport = httpx.HTTPTransport(uds=self.uds) if self.uds else None
        return httpx.Client(
            base_url=self.root_url,
            headers=headers,
            transport=transport,
            timeout=timeout,
            trust_env=not self.local,
        )

    def _sdk_http_options(self, transport_name: str) -> dict[str, Any]:
        options: dict[str, Any] = {"trust_env": not self.local}
        if self.uds:
            options["transport"] = getattr(openai_http_library(), transport_name)(uds=self.uds)
        return options

    def openai_client(self) -> openai.OpenAI:
        """Return an OpenAI SDK client for this server."""
        http_client = openai.DefaultHttpxClient(**self._sdk_http_options("HTTPTransport"))
        return openai.OpenAI(
            base_url=self.base_url, api_key=self.api_key or NO_API_KEY, http_client=http_client
        )

    def async_openai_client(self) -> openai.AsyncOpenAI:
        """Return an async OpenAI SDK client for this server."""
        options = self._sdk_http_options("AsyncHTTPTransport")
        http_client = openai.DefaultAsyncHttpxClient(**options)
        return openai.AsyncOpenAI(
            base_url=self.base_url, api_key=self.api_key or NO_API_KEY, http_client=http_client
        )


def is_healthy(http: httpx.Client) -> bool:
    """Return whether GET /health answers 200."""
    try:
        return http.get("/health").status_code == 200
    except httpx.TransportError:
        return False


def fetch_model_id(endpoint: Endpoint) -> str:
    """Return the id of the first model listed at /v1/models (httpx.TransportError if the
    server cannot be reached)."""
    with endpoint.http_client() as http:
        response = http.get("/v1/models")
    body = _json_or_none(response)
    if response.is_error:
        error = body.get("error", body) if isinstance(body, dict) else response.text
        raise status_error(response.status_code, error)
    models = body.get("data") if isinstance(body, dict) else None
    if not models or not isinstance(models[0], dict) or "id" not in models[0]:
        raise MlxcelError(f"{endpoint.target}: /v1/models lists no model: {response.text[:200]}")
    return str(models[0]["id"])


def _json_or_none(response: httpx.Response) -> object:
    try:
        return response.json()
    except ValueError:
        return None
