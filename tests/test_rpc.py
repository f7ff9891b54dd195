"""One GGUF model across two machines (docs/distributed.md): `mlxcel rpc-server` in one network
namespace, `mlxcel serve --rpc` in another, joined by a veth pair this module creates; over
ggml's raw link and over the keyed channel. Needs root (CI runs as root)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mlxcel.weights import default_model_path
from tests.netns import Pair, RpcServer, namespace_pair
from tests.server_process import MLXCEL, ServerProcess

pytestmark = pytest.mark.slow

RPC_ADDR = "10.213.43.1"
GGML_PORT, CHANNEL_PORT = 50052, 50053
# SmolLM2-135M has 30 layers: the last 15 and the output layer go to the RPC host.
SPLIT = ("--n-gpu-layers", "16")
PROMPT = "List the planets of the solar system in order:"
N_TOKENS = 24


@pytest.fixture(scope="module")
def link() -> Iterator[Pair]:
    """Two namespaces joined by a veth pair: RPC_ADDR in one, SERVE_ADDR in the other."""
    with namespace_pair("mlxc43-", os.getpid() % 100000, "10.213.43") as pair:
        yield pair


def _serve(link: Pair, tmp_path: Path, name: str, *args: str) -> ServerProcess:
    """`mlxcel serve` on the default GGUF in the serving namespace, reached over a Unix
    socket (which crosses namespaces)."""
    return ServerProcess(
        "-m",
        str(default_model_path()),
        "--no-warmup",
        *args,
        socket_path=tmp_path / f"{name}.sock",
        log_path=tmp_path / f"{name}.log",
        prefix=("ip", "netns", "exec", link.serve_ns),
    )


def _greedy(server: ServerProcess, model: str | None = None) -> list[str]:
    """The greedy answer's tokens (of `model`, where the server has several)."""
    with server.http() as http:
        reply = http.post(
            "/v1/completions",
            json={
                **({"model": model} if model else {}),
                "prompt": PROMPT,
                "max_tokens": N_TOKENS,
                "temperature": 0,
                "logprobs": 1,
                "ignore_eos": True,
            },
        )
    assert reply.status_code == 200, reply.text
    tokens: list[str] = reply.json()["choices"][0]["logprobs"]["tokens"]
    assert len(tokens) == N_TOKENS
    return tokens


@pytest.fixture(scope="module")
def alone(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """The greedy tokens of the model served alone, in one process."""
    tmp = tmp_path_factory.mktemp("alone")
    server = ServerProcess(
        "-m", str(default_model_path()), "--no-warmup", socket_path=tmp / "alone.sock"
    )
    try:
        server.wait_ready()
        return _greedy(server)
    finally:
        server.stop()


@pytest.fixture(scope="module")
def key_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("key") / "rpc.key"
    subprocess.run([MLXCEL, "rpc-server", "--new-key", str(path)], check=True, timeout=60)
    assert path.stat().st_mode & 0o077 == 0
    return path


def _devices(server: ServerProcess, model: str | None = None) -> dict[str, dict[str, object]]:
    with server.http() as http:
        props = http.get("/props", params={"model": model} if model else {}).json()
        models = http.get("/v1/models").json()["data"]
    listed = next(m for m in models if model in (None, m["id"]))["meta"]
    assert listed["devices"] == props["devices"]
    return {d["description"]: d for d in props["devices"]}


def test_plain_link_splits_the_layers_and_answers_as_one_process(
    link: Pair, alone: list[str], tmp_path: Path
) -> None:
    rpc = RpcServer(tmp_path / "rpc.log", link.rpc_ns, "--host", RPC_ADDR, "--port", str(GGML_PORT))
    server = _serve(link, tmp_path, "plain", "--rpc", f"{RPC_ADDR}:{GGML_PORT}", *SPLIT)
    try:
        assert "no authentication" in rpc.log()
        server.wait_ready()
        assert _greedy(server) == alone
        devices = _devices(server)
        remote = devices[f"{RPC_ADDR}:{GGML_PORT}"]
        assert str(remote["name"]).startswith("RPC")
        assert remote["layers"] == 16
        assert [d["layers"] for d in devices.values() if d["name"] == "CPU"] == [15]
        # A bare port off this machine works, as llama-server's does, and the log says the risk.
        assert f"--rpc {RPC_ADDR}:{GGML_PORT}: llama.cpp's RPC link has no authentication" in (
            server.log()
        )
    finally:
        server.stop()
        rpc.kill()


def _refused_probes(link: Pair) -> dict[str, object]:
    """From the serving namespace: ggml's HELLO sent bare to the channel's port, and a TLS
    client that answers the challenge without the key."""
    script = f"""
import json, os, socket, ssl
out = {{}}
hello = bytes([14]) + (0).to_bytes(8, "little")
with socket.create_connection(("{RPC_ADDR}", {CHANNEL_PORT}), timeout=10) as s:
    s.sendall(hello)
    try:
        out["bare"] = s.recv(64).hex()
    except OSError as exc:
        out["bare"] = type(exc).__name__
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
with ctx.wrap_socket(socket.create_connection(("{RPC_ADDR}", {CHANNEL_PORT}), timeout=10)) as s:
    hello = b""
    while len(hello) < 45:
        hello += s.recv(45 - len(hello))
    s.sendall(b"R" + os.urandom(64))
    out["magic"] = hello[:13].decode()
    out["answer"] = s.recv(64).hex()
print(json.dumps(out))
"""
    done = subprocess.run(
        ["ip", "netns", "exec", link.serve_ns, sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    result: dict[str, object] = json.loads(done.stdout)
    return result


def _stream_until_error(server: ServerProcess, rpc: RpcServer, model: str) -> str:
    """Start a long greedy stream, kill the RPC host after its first tokens, and return the
    error event the stream ends with."""
    body = {
        "model": model,
        "prompt": PROMPT,
        "max_tokens": 2000,
        "ignore_eos": True,
        "stream": True,
    }
    events = 0
    with server.http() as http, http.stream("POST", "/v1/completions", json=body) as reply:
        assert reply.status_code == 200
        for line in reply.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                return json.dumps(event["error"])
            events += 1
            if events == 3:
                rpc.kill()
    raise AssertionError("the stream ended without an error")


def test_keyed_channel_refuses_others_and_recovers_from_a_lost_host(
    link: Pair, alone: list[str], key_file: Path, tmp_path: Path
) -> None:
    channel = f"{RPC_ADDR}:{CHANNEL_PORT}"
    rpc = RpcServer(
        tmp_path / "rpc.log",
        link.rpc_ns,
        *("--port", str(GGML_PORT), "--listen", channel, "--key-file", str(key_file)),
    )
    wrong = tmp_path / "wrong.key"
    wrong.write_text("not the key, but long enough\n")
    keyed = ("--rpc", f"mlxcel://{channel}", "--rpc-key-file", str(wrong))
    denied = _serve(link, tmp_path, "denied", *keyed)
    server: ServerProcess | None = None
    try:
        before = rpc.accepted()
        # A wrong key stops the start with one line naming the host; nothing reaches ggml.
        assert denied.process.wait(timeout=120) == 2
        assert f"RPC host mlxcel://{channel} refused the key" in denied.log()
        probes = _refused_probes(link)
        assert probes["magic"] == "mlxcel-rpc/1\n"
        assert probes["answer"] == "00"
        # Bare ggml bytes end the TLS handshake: closed, or a TLS alert record (0x15).
        assert probes["bare"] in ("", "ConnectionResetError") or str(probes["bare"])[:2] == "15"
        assert rpc.log().count("did not prove it holds the key") == 2
        assert rpc.accepted() == before

        # The split model beside one served whole, in one server.
        config = tmp_path / "models.yaml"
        config.write_text(
            f"models:\n  - model_path: {default_model_path()}\n    name: split\n"
            f"    rpc: mlxcel://{channel}\n    rpc_key_file: {key_file}\n"
            f"    n_gpu_layers: 16\n  - model_path: {default_model_path()}\n    name: whole\n"
        )
        server = ServerProcess(
            "--config",
            str(config),
            "--no-warmup",
            socket_path=tmp_path / "keyed.sock",
            log_path=tmp_path / "keyed.log",
            prefix=("ip", "netns", "exec", link.serve_ns),
        )
        server.wait_ready()
        assert _greedy(server, "split") == alone
        assert _devices(server, "split")[f"mlxcel://{channel}"]["layers"] == 16
        # ggml opens a connection per query while loading: each one is one that proved the key.
        assert rpc.accepted() - before == rpc.log().count("proved the key") > 0

        started = time.monotonic()
        error = _stream_until_error(server, rpc, "split")
        assert time.monotonic() - started < 60
        assert "model_unavailable" in error
        assert f"mlxcel://{channel}" in error
        with server.http() as http:
            body = {"model": "split", "prompt": PROMPT, "max_tokens": 4}
            down = http.post("/v1/completions", json=body)
            assert down.status_code == 503, down.text
            assert down.json()["error"]["code"] == "model_unavailable"
            assert f"RPC host mlxcel://{channel} is unreachable" in down.text
            assert http.get("/health").status_code == 200
        assert _greedy(server, "whole") == alone

        rpc.start()
        assert _greedy(server, "split") == alone
    finally:
        denied.stop()
        if server is not None:
            server.stop()
        rpc.kill()


def test_unreachable_host_is_one_line_at_start(link: Pair, tmp_path: Path) -> None:
    # The config file's `rpc:` reaches the worker as the flag does.
    config = tmp_path / "models.yaml"
    config.write_text(
        f"models:\n  - model_path: {default_model_path()}\n    rpc: [{RPC_ADDR}:{GGML_PORT + 9}]\n"
    )
    server = ServerProcess(
        "--config",
        str(config),
        socket_path=tmp_path / "nohost.sock",
        log_path=tmp_path / "nohost.log",
        prefix=("ip", "netns", "exec", link.serve_ns),
    )
    try:
        assert server.process.wait(timeout=120) == 2
        assert f"RPC host {RPC_ADDR}:{GGML_PORT + 9} is unreachable" in server.log()
        assert "Traceback" not in server.log()
    finally:
        server.stop()


def test_rpc_flags_are_checked(tmp_path: Path) -> None:
    config = tmp_path / "models.yaml"
    config.write_text(f"models:\n  - model_path: {default_model_path()}\n    rpc: nohost\n")
    for args, message in (
        (["--rpc", "nohost"], "is not HOST:PORT"),
        (["--rpc", "mlxcel://10.0.0.1:1"], "needs --rpc-key-file"),
        (["--tensor-split", "0,0"], "one of them above 0"),
        (["--config", str(config)], "models.yaml:3: models[0].rpc: 'nohost' is not HOST:PORT"),
    ):
        done = subprocess.run(
            [MLXCEL, "serve", *args], capture_output=True, text=True, timeout=60, check=False
        )
        assert done.returncode == 2
        assert message in done.stderr
