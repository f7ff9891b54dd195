"""The Python client (mlxcel.LLM, mlxcel.AsyncLLM) against real servers over real HTTP."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

import mlxcel
from mlxcel.client import _launch
from mlxcel.client._connection import connect_endpoint, is_managed, resolve_api_key
from mlxcel.client._launch import resolve_binary, server_args
from mlxcel.client._requests import chat_request, completion_request, split_sampling
from mlxcel.errors import status_error
from tests._client_util import alive, default_gguf, fake_binary, run_python
from tests.server_process import MLXCEL, ServerProcess, free_port

HELLO = [{"role": "user", "content": "Say hello."}]
ALIAS = "tiny-smol"


# Pure functions: how keywords become requests and command lines.


def test_sampling_fields_go_top_level_and_the_rest_in_extra_body() -> None:
    kwargs = split_sampling(
        {"max_tokens": 8, "temperature": 0.5, "top_k": 40, "min_p": 0.05, "p_less": True},
        frozenset({"max_tokens", "temperature"}),
    )
    assert kwargs == {
        "max_tokens": 8,
        "temperature": 0.5,
        "extra_body": {"top_k": 40, "min_p": 0.05, "p_less": True},
    }


def test_explicit_extra_body_wins_and_none_means_unset() -> None:
    kwargs = split_sampling(
        {"top_k": 40, "seed": None, "timeout": 5, "extra_body": {"top_k": 1, "dry_base": 1.75}},
        frozenset({"seed"}),
    )
    assert kwargs == {"timeout": 5, "extra_body": {"top_k": 1, "dry_base": 1.75}}


def test_chat_and_completion_fields_differ() -> None:
    chat = chat_request("m", HELLO, {"response_format": {"type": "json_object"}, "top_k": 3})
    assert chat["response_format"] == {"type": "json_object"}
    assert chat["extra_body"] == {"top_k": 3}
    completion = completion_request("m", "hi", {"response_format": {"type": "text"}, "echo": True})
    assert completion["echo"] is True
    assert completion["extra_body"] == {"response_format": {"type": "text"}}


def test_arguments_the_client_sets_or_cannot_honour_are_rejected() -> None:
    with pytest.raises(TypeError, match="stream"):
        completion_request("m", "hi", {"stream": True})
    with pytest.raises(ValueError, match="n > 1"):
        chat_request("m", HELLO, {"n": 2})


def test_server_kwargs_become_flags() -> None:
    args = server_args(
        "model.gguf",
        socket_path="/tmp/s.sock",
        host=None,
        port=None,
        options={
            "ctx_size": 512,
            "n_predict": 16,
            "alias": "a",
            "warmup": False,
            "log_level": "debug",
            "api_key_file": Path("keys.txt"),
            "metrics": True,
            "slots": False,
            "threads": None,
            "extra_args": ["--parallel", 2],
        },
    )
    assert args == [
        "serve", "--model", "model.gguf", "--socket", "/tmp/s.sock", "--exit-on-stdin-close",
        "--ctx-size", "512", "--n-predict", "16", "--alias", "a", "--no-warmup",
        "--log-level", "debug", "--api-key-file", "keys.txt", "--metrics",
        "--parallel", "2",
    ]  # fmt: skip
    tcp = server_args(None, socket_path=None, host="127.0.0.1", port=9, options={"warmup": True})
    assert tcp == ["serve", "--host", "127.0.0.1", "--port", "9", "--exit-on-stdin-close"]
    with pytest.raises(TypeError, match="extra_args"):
        server_args(None, socket_path="s", host=None, port=None, options={"extra_args": "-np 2"})


def test_binary_is_found_through_argument_then_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MLXCEL_BIN", "/opt/from-env")
    assert resolve_binary("/opt/explicit") == ["/opt/explicit"]
    assert resolve_binary(None) == ["/opt/from-env"]
    monkeypatch.delenv("MLXCEL_BIN")
    monkeypatch.setenv("PATH", "")
    # Not on PATH: the CLI is run with this interpreter.
    assert resolve_binary(None)[0] == sys.executable


@pytest.mark.parametrize(
    "kwargs",
    [
        {"model": "m", "base_url": "http://127.0.0.1:9/v1"},
        {"base_url": "http://127.0.0.1:9/v1", "socket": "/tmp/s.sock"},
        {"socket": "/tmp/s.sock", "host": "127.0.0.1"},
        {"base_url": "http://127.0.0.1:9/v1", "ctx_size": 512},
    ],
)
def test_ambiguous_arguments_raise_before_spawning(
    kwargs: dict[str, str | int], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "spawned"
    monkeypatch.setenv("MLXCEL_BIN", str(fake_binary(tmp_path, f"touch {marker}; sleep 5")))
    with pytest.raises(mlxcel.MlxcelError):
        mlxcel.LLM(**kwargs)
    assert not marker.exists()


def managed(model: str | None, base_url: str | None, socket: str | None) -> bool:
    """is_managed with nothing but a model and a connect target."""
    return is_managed(
        model, base_url=base_url, socket=socket, host=None, port=None, binary=None, server_kwargs={}
    )


def test_modes() -> None:
    assert managed(None, None, None)
    assert managed("m", None, "s.sock")
    assert not managed(None, "http://h/v1", None)
    assert not managed(None, None, "s.sock")
    assert connect_endpoint("http://h:1/v1/", None, None).root_url == "http://h:1"
    assert connect_endpoint("http://h:1", None, None).base_url == "http://h:1/v1"


def test_api_key_defaults_to_the_servers_environment_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MLXCEL_API_KEY", " first, second")
    assert resolve_api_key(None) == "first"
    assert resolve_api_key("explicit") == "explicit"


def test_status_errors_map_to_classes() -> None:
    error = status_error(401, {"message": "bad key", "type": "authentication_error"})
    assert isinstance(error, mlxcel.AuthenticationError)
    assert (error.status_code, error.message) == (401, "bad key")
    assert error.error_type == "authentication_error"
    assert isinstance(status_error(503, "busy"), mlxcel.ServerError)
    assert type(status_error(429, None)) is mlxcel.APIStatusError


SERVER_MODULES = (
    "llama_cpp fastapi uvicorn starlette "
    "mlxcel.api mlxcel.engine mlxcel.serving mlxcel.backends mlxcel.cli mlxcel.weights "
    "mlxcel.config mlxcel.models mlxcel.worker mlxcel.wire mlxcel.protocol"
)


def test_import_pulls_in_no_server_code() -> None:
    code = (
        "import sys, mlxcel; assert 'openai' not in sys.modules; import mlxcel.client; "
        f"server = set({SERVER_MODULES!r}.split()); "
        "print(sorted(m for m in sys.modules "
        "if {m.split('.')[0], '.'.join(m.split('.')[:2])} & server))"
    )
    assert run_python(code) == "[]"


def test_connection_refused_is_an_api_connection_error_naming_the_url() -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    with mlxcel.LLM(base_url=url) as llm:
        with pytest.raises(mlxcel.APIConnectionError, match=re.escape(url)):
            llm.model  # noqa: B018
        llm._model = "default"  # past model discovery, a request fails the same way
        with pytest.raises(mlxcel.APIConnectionError, match=re.escape(url)) as caught:
            llm.chat(HELLO, max_tokens=1)
    assert isinstance(caught.value.__cause__, openai.APIConnectionError)


def test_a_missing_socket_is_named_in_the_error(tmp_path: Path) -> None:
    path = tmp_path / "absent.sock"
    with mlxcel.LLM(socket=path) as llm:
        with pytest.raises(mlxcel.APIConnectionError) as caught:
            llm.model  # noqa: B018
        assert f"unix socket {path}" in str(caught.value)
        assert "No such file or directory" in str(caught.value)
        assert "http://localhost" not in str(caught.value)
        llm._model = "default"
        with pytest.raises(mlxcel.APIConnectionError, match=re.escape(f"unix socket {path}")):
            llm.chat(HELLO, max_tokens=1)

    async def ask() -> str:
        async with mlxcel.AsyncLLM(socket=path) as async_llm:
            return await async_llm.generate("Hi", max_tokens=1)

    with pytest.raises(mlxcel.APIConnectionError, match=re.escape(f"unix socket {path}")):
        asyncio.run(ask())


# Managed mode with stand-in binaries: startup failures, timeouts, what the child receives.


def test_child_exiting_early_raises_startup_error_with_its_output(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    script = fake_binary(tmp_path, 'echo "args: $*" >&2; echo "key: $MLXCEL_API_KEY"; exit 3')
    caplog.set_level(logging.DEBUG, logger="mlxcel.client")
    # A startup timeout far beyond the test's own: the error must come from the child's exit.
    with pytest.raises(mlxcel.ServerStartupError) as caught:
        mlxcel.LLM(binary=script, api_key="k3y", ctx_size=64, startup_timeout=3600)
    error = caught.value
    assert error.returncode == 3
    assert "key: k3y" in str(error)
    args = next(line for line in error.output if line.startswith("args: ")).split()
    assert args[1:3] == ["serve", "--socket"]
    assert args[-2:] == ["--ctx-size", "64"]
    assert "k3y" not in args
    # The private socket directory is gone with the child.
    assert not Path(args[3]).parent.exists()
    assert "key: k3y" in caplog.text


def test_startup_timeout_kills_the_child(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    script = fake_binary(tmp_path, f"echo $$ > {pid_file}; exec sleep 60")
    with pytest.raises(mlxcel.ServerTimeoutError):
        mlxcel.LLM(binary=script, startup_timeout=1)
    assert not alive(int(pid_file.read_text()))


def test_a_leaked_handle_stops_its_server(tmp_path: Path) -> None:
    # AsyncLLM spawns without waiting, so a server that never answers is enough here.
    llm = mlxcel.AsyncLLM(binary=fake_binary(tmp_path, "exec sleep 60"))
    pid = llm.pid
    assert pid is not None and alive(pid)
    del llm
    gc.collect()
    assert not alive(pid)


def test_interpreter_exit_stops_a_leaked_server(tmp_path: Path) -> None:
    script = fake_binary(tmp_path, "exec sleep 60")
    code = f"import mlxcel; llm = mlxcel.AsyncLLM(binary={str(script)!r}); print(llm.pid)"
    assert not alive(int(run_python(code)))


def test_a_server_ignoring_sigterm_is_killed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(_launch, "STOP_GRACE_S", 0.5)
    pid_file = tmp_path / "pid"
    script = fake_binary(
        tmp_path, f"trap '' TERM; echo $$ > {pid_file}; while :; do sleep 0.1; done"
    )
    with pytest.raises(mlxcel.ServerTimeoutError):
        mlxcel.LLM(binary=script, startup_timeout=1)
    assert not alive(int(pid_file.read_text()))
    assert "ignored SIGTERM" in caplog.text


def test_async_startup_error_surfaces_when_awaited(tmp_path: Path) -> None:
    llm = mlxcel.AsyncLLM(binary=fake_binary(tmp_path, "exit 3"))

    async def use() -> None:
        async with llm:
            pass

    with pytest.raises(mlxcel.ServerStartupError, match="code 3"):
        asyncio.run(use())


def test_a_missing_binary_is_a_launch_error(tmp_path: Path) -> None:
    with pytest.raises(mlxcel.ServerLaunchError, match="cannot start"):
        mlxcel.LLM(binary=tmp_path / "no-such-binary")


# The real server on the real default model.


@pytest.fixture(scope="module")
def managed_llm() -> Iterator[mlxcel.LLM]:
    """A managed server on the embedded default model, over a private Unix socket."""
    with mlxcel.LLM(binary=MLXCEL, threads=1) as llm:
        yield llm


@pytest.fixture(scope="module")
def aliased_socket(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A managed server on an explicit GGUF path and socket, served under an alias."""
    path = tmp_path_factory.mktemp("sock") / "mlxcel.sock"
    with mlxcel.LLM(
        default_gguf(), binary=MLXCEL, socket=path, alias=ALIAS, ctx_size=1024, threads=1
    ):
        yield path


@pytest.mark.slow
def test_managed_generate_and_chat(managed_llm: mlxcel.LLM) -> None:
    assert managed_llm.model
    assert managed_llm.pid is not None and alive(managed_llm.pid)
    assert managed_llm.generate("Once upon a time", max_tokens=16, temperature=0)
    assert managed_llm.chat(HELLO, max_tokens=16, temperature=0)


@pytest.mark.slow
def test_managed_streams_yield_several_deltas(managed_llm: mlxcel.LLM) -> None:
    deltas = list(managed_llm.stream_generate("Once upon a time", max_tokens=16, temperature=0))
    assert len(deltas) > 2
    deltas = list(managed_llm.stream_chat(HELLO, max_tokens=16, temperature=0))
    assert len(deltas) > 2


@pytest.mark.slow
def test_server_specific_sampling_knobs_are_accepted(managed_llm: mlxcel.LLM) -> None:
    assert managed_llm.generate("Once upon a time", max_tokens=8, top_k=40, min_p=0.05)


@pytest.mark.slow
def test_server_errors_become_mlxcel_errors(managed_llm: mlxcel.LLM) -> None:
    with pytest.raises(mlxcel.BadRequestError) as caught:
        managed_llm.chat(HELLO, max_tokens="many")
    assert caught.value.status_code == 400
    assert isinstance(caught.value.__cause__, openai.APIStatusError)


@pytest.mark.slow
def test_openai_client_works_over_the_private_socket(managed_llm: mlxcel.LLM) -> None:
    client = managed_llm.openai_client
    assert client.models.list().data[0].id == managed_llm.model
    response = client.completions.create(model=managed_llm.model, prompt="Hi", max_tokens=4)
    assert response.choices[0].text


@pytest.mark.slow
def test_managed_explicit_model_is_served_under_its_alias(aliased_socket: Path) -> None:
    with mlxcel.LLM(socket=aliased_socket) as llm:
        assert llm.pid is None
        assert llm.model == ALIAS
        assert llm.chat(HELLO, max_tokens=8)
        assert llm.openai_client.models.list().data[0].id == ALIAS


@pytest.mark.slow
def test_connect_over_tcp(server: ServerProcess) -> None:
    with mlxcel.LLM(base_url=server.base_url) as llm:
        assert llm.pid is None
        assert llm.model
        assert llm.generate("Once upon a time", max_tokens=8)
    assert server.process.poll() is None, "connect mode must not stop the server"


@pytest.mark.slow
def test_async_connect_over_tcp_and_socket(server: ServerProcess, aliased_socket: Path) -> None:
    async def use(llm: mlxcel.AsyncLLM) -> list[str]:
        async with llm:
            chat = await llm.chat(HELLO, max_tokens=8)
            text = await llm.generate("Once upon a time", max_tokens=8)
            deltas = [delta async for delta in llm.stream_chat(HELLO, max_tokens=8)]
            listed = await llm.openai_client.models.list()
            assert listed.data[0].id == llm.model
        return [chat, text, "".join(deltas)]

    assert all(asyncio.run(use(mlxcel.AsyncLLM(base_url=server.base_url))))
    assert all(asyncio.run(use(mlxcel.AsyncLLM(socket=aliased_socket))))


@pytest.mark.slow
def test_async_managed_default_model() -> None:
    async def use() -> tuple[int | None, list[str]]:
        async with mlxcel.AsyncLLM(binary=MLXCEL, threads=1) as llm:
            deltas = [d async for d in llm.stream_generate("Once upon a time", max_tokens=16)]
            assert await llm.chat(HELLO, max_tokens=8)
            return llm.pid, deltas

    pid, deltas = asyncio.run(use())
    assert len(deltas) > 2
    assert pid is not None and not alive(pid)


@pytest.mark.slow
def test_managed_tcp_with_api_key_and_idempotent_close() -> None:
    llm = mlxcel.LLM(binary=MLXCEL, host="127.0.0.1", api_key="s3cret", warmup=False, threads=1)
    assert llm.base_url.startswith("http://127.0.0.1:")
    assert llm.chat(HELLO, max_tokens=8)
    denied = httpx.get(f"{llm.base_url}/models", timeout=30)
    assert denied.status_code == 401
    assert denied.json()["error"]["type"]
    pid = llm.pid
    assert pid is not None
    llm.close()
    llm.close()
    assert not alive(pid)


@pytest.mark.slow
def test_a_managed_server_that_died_is_named_with_its_pid_and_last_output() -> None:
    with mlxcel.LLM(binary=MLXCEL, warmup=False, threads=1) as llm:
        assert llm.chat(HELLO, max_tokens=2)
        pid = llm.pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        with pytest.raises(mlxcel.ServerExitedError) as caught:
            llm.chat(HELLO, max_tokens=2)
    _assert_killed(caught.value, pid)
    assert "unix socket " in str(caught.value)


def _assert_killed(error: mlxcel.ServerExitedError, pid: int) -> None:
    """The error names the managed server's pid, its exit by SIGKILL, and its last output."""
    assert isinstance(error, mlxcel.APIConnectionError)
    assert (error.pid, error.returncode) == (pid, -signal.SIGKILL.value)
    assert f"managed server pid {pid}, exited with code -9: killed by SIGKILL" in str(error)
    assert error.output and any("listening on unix:" in line for line in error.output)
    assert error.output[-1] in str(error)


@pytest.mark.slow
def test_a_managed_server_that_dies_mid_stream_is_named_too() -> None:
    with mlxcel.LLM(binary=MLXCEL, warmup=False, threads=1) as llm:
        pid = llm.pid
        assert pid is not None
        deltas = llm.stream_generate("Once upon a time", max_tokens=1500, ignore_eos=True)
        next(deltas)
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(mlxcel.ServerExitedError) as caught:
            for _ in deltas:
                pass
    _assert_killed(caught.value, pid)


@pytest.mark.slow
def test_a_managed_server_exits_when_its_parent_is_killed(tmp_path: Path) -> None:
    code = (
        "import os, signal, mlxcel\n"
        f"llm = mlxcel.LLM(binary={MLXCEL!r}, warmup=False)\n"
        "print(llm.pid, llm._endpoint.uds, flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    parent = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False
    )
    assert parent.returncode == -signal.SIGKILL.value, parent.stderr
    pid, sock = parent.stdout.split()
    deadline = time.monotonic() + 60
    # The orphan shut down cleanly: it stopped, and removed its socket file on the way out.
    while alive(int(pid)) or Path(sock).exists():
        assert time.monotonic() < deadline, "the managed server outlived its parent"
        time.sleep(0.05)
    # And the private folder the parent made for the socket, which the parent could not.
    assert not Path(sock).parent.exists()


@pytest.mark.slow
def test_missing_model_file_raises_startup_error_with_server_output(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model.gguf"
    with pytest.raises(mlxcel.ServerStartupError) as caught:
        mlxcel.LLM(missing, binary=MLXCEL)
    assert caught.value.returncode != 0
    assert "no-such-model.gguf" in str(caught.value)
