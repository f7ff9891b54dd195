"""What LLM and AsyncLLM share: their arguments, the server they reach, and its model id."""

import os
import signal
import threading
from abc import ABC, abstractmethod
from contextlib import AbstractContextManager
from typing import Any, Generic, TypeVar

import httpx

from mlxcel.client._connection import connect_endpoint, is_managed, launch, resolve_api_key
from mlxcel.client._endpoint import HEALTH_PROBE_TIMEOUT_S, Endpoint, fetch_model_id, is_healthy
from mlxcel.client._launch import ServerProcess
from mlxcel.client._requests import api_errors
from mlxcel.errors import APIConnectionError, ServerExitedError

ClientT = TypeVar("ClientT")
# How long a broken connection waits for a managed server that may be exiting.
EXIT_WAIT_S = 1.0


def _signal(returncode: int) -> str:
    """`: killed by SIGKILL` for an exit status that is a signal."""
    if returncode >= 0:
        return ""
    try:
        return f": killed by {signal.Signals(-returncode).name}"
    except ValueError:
        return ""


class BaseLLM(ABC, Generic[ClientT]):
    """A handle on one mlxcel server, spawned and supervised unless told where to connect.

    Managed mode (the default) runs `[binary, "serve", ...]`, where binary is `binary=`, else
    $MLXCEL_BIN, else `mlxcel` on PATH, else this interpreter running `mlxcel.cli`. It listens
    on a Unix socket in a private temporary directory, on `socket=` if given, or on TCP when
    `host=` or `port=` is given (a free port if `port=` is not). Every other keyword becomes a
    server flag: `ctx_size=512` is `--ctx-size 512`, True a bare flag, False or None nothing,
    `warmup=False` is `--no-warmup`, and `extra_args=[...]` is appended verbatim.

    Connect mode (`base_url=` or `socket=` without a model) spawns nothing.

    `api_key=` defaults to the first key in $MLXCEL_API_KEY; a managed server receives it
    through that variable, never on its command line.
    """

    def __init__(
        self,
        model: str | os.PathLike[str] | None = None,
        *,
        binary: str | os.PathLike[str] | None = None,
        host: str | None = None,
        port: int | None = None,
        socket: str | os.PathLike[str] | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        startup_timeout: float = 600.0,
        **server_kwargs: Any,
    ) -> None:
        self._process: ServerProcess | None = None
        self._endpoint: Endpoint
        managed = is_managed(
            model,
            base_url=base_url,
            socket=socket,
            host=host,
            port=port,
            binary=binary,
            server_kwargs=server_kwargs,
        )
        if managed:
            self._process, self._endpoint = launch(
                model,
                binary=binary,
                host=host,
                port=port,
                socket=socket,
                api_key=api_key,
                server_kwargs=server_kwargs,
            )
        else:
            self._endpoint = connect_endpoint(base_url, socket, resolve_api_key(api_key))
        self._startup_timeout = startup_timeout
        self._ready = False
        self._model: str | None = None
        # AsyncLLM may wait from several worker threads at once; one of them polls.
        self._lock = threading.Lock()
        try:
            self._client = self._open()
        except BaseException:
            self._stop_server()
            raise

    @abstractmethod
    def _open(self) -> ClientT:
        """Return the SDK client for a new handle (LLM also waits for the server here)."""

    def _wait_ready(self) -> None:
        with self._lock:
            if self._ready or self._process is None:
                return
            with self._endpoint.http_client(timeout=HEALTH_PROBE_TIMEOUT_S) as http:
                self._process.wait_ready(lambda: is_healthy(http), self._startup_timeout)
            self._ready = True

    def _model_id(self) -> str:
        if self._model is None:
            self._wait_ready()
            try:
                self._model = fetch_model_id(self._endpoint)
            except httpx.TransportError as exc:
                raise self._unreachable(exc) from exc
        return self._model

    def _unreachable(self, cause: BaseException) -> APIConnectionError:
        """A connection failure that says where the server is and, for a managed one, its pid,
        whether it still runs, and what it printed last."""
        reason = str(cause) or type(cause).__name__
        message = f"no answer from the mlxcel server at {self._endpoint.target}: {reason}"
        if self._process is None:
            return APIConnectionError(message)
        process = self._process
        code = process.exit_code(EXIT_WAIT_S)
        if code is None:
            message += f" (managed server pid {process.pid}, still running)"
            return APIConnectionError(message, process.output.snapshot())
        message += f" (managed server pid {process.pid}, exited with code {code}{_signal(code)})"
        return ServerExitedError(
            message, pid=process.pid, returncode=code, output=process.output.snapshot()
        )

    def _api_errors(self) -> AbstractContextManager[None]:
        """SDK errors as mlxcel errors, a connection failure naming this server."""
        return api_errors(self._unreachable)

    def _stop_server(self) -> None:
        if self._process is not None:
            self._process.stop()

    @property
    def openai_client(self) -> ClientT:
        """The underlying OpenAI SDK client, for everything the helpers do not cover."""
        return self._client

    @property
    def model(self) -> str:
        """The served model id, asked of /v1/models on first use (blocking)."""
        return self._model_id()

    @property
    def base_url(self) -> str:
        """The server's OpenAI base URL (http://localhost/v1 over a Unix socket)."""
        return self._endpoint.base_url

    @property
    def pid(self) -> int | None:
        """The managed server's process id, or None in connect mode."""
        return None if self._process is None else self._process.pid
