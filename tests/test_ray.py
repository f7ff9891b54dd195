"""Replicas on a Ray cluster (`serve --ray`): a one-node cluster on loopback that the test
starts (`ray start --head`, its own temp dir), two replicas of the default model deployed on
it. Requests are answered through Ray with the same greedy output as a local server, a
repeated prefix returns to the replica that holds it, a replica whose worker is killed fails
its stream with 503 and Ray replaces it, and an unreachable cluster is one line and exit 2."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests._client_util import default_gguf
from tests.conftest import start
from tests.server_process import MLXCEL, ServerProcess, free_port

pytestmark = pytest.mark.slow

RAY = Path(MLXCEL).with_name("ray")
SYSTEMS = 3
REPEATS = 3


def _kill_cluster(head: subprocess.Popen[bytes], temp_dir: str) -> None:
    """End every process of the test's cluster: `ray start --block`'s group, then whatever
    else names its temp dir (Ray's workers and replica actors)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(head.pid, sig)
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if temp_dir.encode() in cmdline:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(entry.name), sig)
        time.sleep(2 if sig == signal.SIGTERM else 0)
    head.wait(10)


@pytest.fixture(scope="module")
def ray_address() -> Iterator[str]:
    """A one-node Ray cluster on 127.0.0.1, no dashboard, no usage stats."""
    temp_dir = tempfile.mkdtemp(prefix="mlxc42r-", dir="/tmp")
    port = free_port()
    head = subprocess.Popen(
        [
            str(RAY),
            "start",
            "--head",
            "--block",
            "--node-ip-address=127.0.0.1",
            f"--port={port}",
            f"--temp-dir={temp_dir}",
            "--include-dashboard=false",
            "--num-cpus=4",
            "--disable-usage-stats",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"},
        start_new_session=True,
    )
    try:
        address = f"127.0.0.1:{port}"
        deadline = time.monotonic() + 90
        while subprocess.run(
            [str(RAY), "status", f"--address={address}"], capture_output=True, check=False
        ).returncode:
            assert head.poll() is None, "ray start --head failed"
            assert time.monotonic() < deadline, "the Ray head did not start"
            time.sleep(1)
        yield address
    finally:
        _kill_cluster(head, temp_dir)
        shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def on_ray(ray_address: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The default model as two replicas on the cluster, one CPU and one thread each."""
    tmp = tmp_path_factory.mktemp("ray")
    config = tmp / "models.yaml"
    config.write_text(
        f"ray:\n  address: {ray_address}\n"
        f"models:\n  - model: {default_gguf()}\n    replicas: 2\n    parallel: 2\n"
        "    ctx_size: 4096\n    ray_actor_options: {num_cpus: 1}\n"
    )
    server = start(tmp, "--config", str(config), ready_timeout=180)
    yield server
    server.stop()


def replicas(server: ServerProcess) -> list[dict[str, Any]]:
    with server.http() as http:
        listed: list[dict[str, Any]] = http.get("/v1/models").json()["data"][0]["meta"]["replicas"]
    return listed


def chat(server: ServerProcess, messages: list[dict[str, str]], **body: Any) -> httpx.Response:
    with server.http() as http:
        return http.post(
            "/v1/chat/completions",
            json={"messages": messages, "max_tokens": 8, "temperature": 0, **body},
        )


def system_prompt(index: int) -> str:
    rules = " ".join(f"Rule {j}: item {index * 1000 + j} is filed under {j % 7}." for j in range(8))
    return f"{['Alpha', 'Bravo', 'Charlie'][index]} desk. {rules}"


def test_greedy_output_through_ray_equals_local(on_ray: ServerProcess, server: Any) -> None:
    messages = [{"role": "user", "content": "Name three colours."}]
    through_ray = chat(on_ray, messages)
    local = chat(server, messages)
    assert through_ray.status_code == 200, through_ray.text
    assert through_ray.json()["choices"][0]["message"] == local.json()["choices"][0]["message"]
    listed = replicas(on_ray)
    assert listed and all(r["node"] == "127.0.0.1" and r["pid"] > 0 for r in listed)


def test_repeated_prefix_returns_to_its_replica(on_ray: ServerProcess) -> None:
    hits = repeats = 0
    for round_ in range(REPEATS):
        for index in range(SYSTEMS):
            messages = [
                {"role": "system", "content": system_prompt(index)},
                {"role": "user", "content": f"Where is item {round_}?"},
            ]
            response = chat(on_ray, messages, max_tokens=1)
            assert response.status_code == 200, response.text
            usage = response.json()["usage"]
            if round_ > 0:
                repeats += 1
                cached = usage["prompt_tokens_details"]["cached_tokens"]
                hits += cached >= usage["prompt_tokens"] // 2
    assert hits >= 0.9 * repeats, (hits, repeats)
    # New prompts spread: both replicas answered.
    assert len([r for r in replicas(on_ray) if r["state"] == "serving"]) == 2
    prefix = on_ray.metric("mlxcel_replica_routed_total", decision="prefix")
    assert prefix >= 0.9 * repeats


def test_killed_replica_fails_its_stream_and_ray_replaces_it(on_ray: ServerProcess) -> None:
    lines: list[str] = []
    body = {
        "messages": [{"role": "user", "content": "Count slowly."}],
        "max_tokens": 1500,
        "temperature": 0,
        "stream": True,
        "ignore_eos": True,
    }

    def stream() -> None:
        with (
            on_ray.http() as http,
            http.stream("POST", "/v1/chat/completions", json=body) as response,
        ):
            lines.extend(line for line in response.iter_lines() if line)

    reader = threading.Thread(target=stream)
    reader.start()
    deadline = time.monotonic() + 30
    while not (busy := [r for r in replicas(on_ray) if r["running"] > 0]) or len(lines) < 3:
        assert time.monotonic() < deadline, "the stream did not start"
        time.sleep(0.1)
    os.kill(busy[0]["pid"], signal.SIGKILL)
    reader.join(30)
    assert not reader.is_alive(), "the stream hangs"
    assert lines[-1] == "data: [DONE]"
    assert '"model_unavailable"' in lines[-2] and "SIGKILL" in lines[-2]
    # Ray starts another replica, which new prompts reach (the emptiest cache); meanwhile a
    # request may get 503, never hang.
    before = {r["pid"] for r in replicas(on_ray)}
    deadline = time.monotonic() + 60
    for attempt in range(1000):
        messages = [
            {"role": "system", "content": f"Desk {attempt}. Items are filed by number."},
            {"role": "user", "content": "Where is item 7?"},
        ]
        response = chat(on_ray, messages, max_tokens=1)
        assert response.status_code in (200, 503), response.text
        if response.status_code == 200 and {r["pid"] for r in replicas(on_ray)} - before:
            break
        assert time.monotonic() < deadline, "no replica came back"
        time.sleep(0.2)
    listed = replicas(on_ray)
    assert len(listed) == 2 and all(r["state"] == "serving" for r in listed), listed
    assert busy[0]["pid"] not in {r["pid"] for r in listed}


def test_unreachable_cluster_is_one_line_and_exit_2(tmp_path: Path) -> None:
    port = free_port()
    done = subprocess.run(
        [MLXCEL, "serve", "--replicas", "2", "--ray", f"127.0.0.1:{port}", "--port", "1"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"mlxcel: the Ray cluster at 127.0.0.1:{port} cannot be reached: Connection refused"
    ]
