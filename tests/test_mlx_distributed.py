"""One MLX model over two machines: rank 0 serves HTTP in one network namespace, rank 1 holds
the other part of the model in a second, and the ring runs over a veth pair between them.

Greedy output must be the one-machine server's, token for token, in tensor and in pipeline
mode; streams, concurrent requests and cancels behave as on one machine; a rank killed or
stopped mid-stream fails the request with a 503 naming it within the bound, and a later
request reloads the model. Needs root (namespaces); everything it creates is removed after.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import openai
import pytest

pytest.importorskip("mlx_lm")

from tests.conftest import LLAMA_DIR, serving
from tests.netns_ranks import HTTP, RING, Namespaces, children, ranks_apart, write_hostfile
from tests.server_process import MLXCEL, ServerProcess, alive

pytestmark = pytest.mark.slow

PREFIX = f"mlxc44-{os.getpid() % 100000}"
PORT = 18444
RANK_TIMEOUT = 5.0
GREEDY: dict[str, Any] = {"temperature": 0, "extra_body": {"ignore_eos": True}}
PROMPTS = ("Tell me a story about a dragon.", "Name three cities.")


@pytest.fixture(scope="module")
def namespaces() -> Iterator[Namespaces]:
    """Two namespaces, the ring's veth pair between them, and one to reach rank 0's HTTP."""
    if os.geteuid() != 0:
        pytest.fail("these tests create network namespaces: run them as root")
    with ranks_apart(PREFIX) as spaces:
        yield spaces


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen2: mlx-lm splits it either way (tensor and pipeline)."""
    from tests.mlx_model import build_model

    return build_model(tmp_path_factory.mktemp("mlx-dist") / "tiny-qwen2", "qwen2", seed=2)


@pytest.fixture(scope="module")
def hostfile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_hostfile(tmp_path_factory.mktemp("mlx-dist-hosts") / "hosts.json")


@pytest.fixture(scope="module")
def rank1(
    namespaces: Namespaces, hostfile: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[subprocess.Popen[bytes]]:
    """Rank 1's process in the second namespace, for the module (it takes session after session)."""
    log = open(tmp_path_factory.mktemp("rank1") / "rank1.log", "wb")  # noqa: SIM115
    command = namespaces.run(1, [MLXCEL, "serve", "--distributed", str(hostfile), "--rank", "1"])
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:
        yield process
    finally:
        for pid in children(process.pid):
            os.kill(pid, signal.SIGKILL)
        process.kill()
        process.wait()
        log.close()


@pytest.fixture(scope="module")
def one_rank(model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The same model served on one machine: the answers to match."""
    yield from serving(tmp_path_factory, "mlx-one-rank", "-m", str(model), "-np", "2")


class RankZero(ServerProcess):
    """`mlxcel serve --distributed` in rank 0's namespace, reached over its veth."""

    def __init__(self, namespaces: Namespaces, *args: str, log_path: Path) -> None:
        self.namespaces = namespaces
        super().__init__(*args, log_path=log_path)

    def _spawn(self) -> None:
        self.port = PORT
        where = ["--host", HTTP[1], "--port", str(PORT), "--threads", "1"]
        self.command = self.namespaces.run(0, [MLXCEL, "serve", *where, *self.args])
        self._log = open(self.log_path, "wb")  # type: ignore[arg-type]  # noqa: SIM115
        self.process = subprocess.Popen(
            self.command, stdout=self._log, stderr=subprocess.STDOUT, env=self.env
        )

    @property
    def root(self) -> str:
        return f"http://{HTTP[1]}:{PORT}"


@pytest.fixture(scope="module", params=["tensor", "pipeline"])
def group(
    request: pytest.FixtureRequest,
    namespaces: Namespaces,
    rank1: subprocess.Popen[bytes],
    model: Path,
    hostfile: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[RankZero]:
    """Rank 0 serving the model over both ranks, split as the parameter says."""
    log = tmp_path_factory.mktemp(f"rank0-{request.param}") / "server.log"
    server = RankZero(
        namespaces, "-m", str(model), "-np", "2", "--distributed", str(hostfile),
        "--parallel-mode", request.param, "--rank-timeout", str(RANK_TIMEOUT), log_path=log,
    )  # fmt: skip
    try:
        server.wait_ready(180)
        yield server
    finally:
        server.stop()


def _session(rank1: subprocess.Popen[bytes]) -> int:
    """The process holding rank 1's part of the model now."""
    sessions = [pid for pid in children(rank1.pid) if alive(pid)]
    assert len(sessions) == 1, sessions
    return sessions[0]


def _greedy(client: openai.OpenAI, prompt: str, cached: list[int] | None = None) -> list[str]:
    """The greedy answer's tokens; `cached` gets how many prompt tokens the slot held."""
    answer = client.chat.completions.create(
        model="x",
        messages=[{"role": "user", "content": prompt}],
        max_tokens=24,
        logprobs=True,
        **GREEDY,
    )
    assert answer.choices[0].logprobs and answer.choices[0].logprobs.content
    if cached is not None and answer.usage and answer.usage.prompt_tokens_details:
        cached.append(answer.usage.prompt_tokens_details.cached_tokens or 0)
    return [entry.token for entry in answer.choices[0].logprobs.content]


@pytest.fixture(scope="module")
def expected(one_rank: ServerProcess) -> dict[str, list[str]]:
    client = one_rank.openai()
    return {prompt: _greedy(client, prompt) for prompt in PROMPTS}


def test_greedy_tokens_are_one_ranks(group: RankZero, expected: dict[str, list[str]]) -> None:
    client = group.openai()
    for prompt in PROMPTS:
        assert _greedy(client, prompt) == expected[prompt]
    # The second time the prompt's prefix comes from the slots' cache, on both ranks.
    cached: list[int] = []
    assert _greedy(client, PROMPTS[0], cached) == expected[PROMPTS[0]]
    assert cached[0] > 0


def test_the_group_is_listed(group: RankZero) -> None:
    with group.http() as http:
        listed = http.get("/v1/models").json()["data"][0]
        props = http.get("/props").json()
    ranks = listed["meta"]["distributed"]["ranks"]
    assert [r["host"] for r in ranks] == list(RING)
    assert listed["meta"]["distributed"]["mode"] in ("tensor", "pipeline")
    assert props["distributed"] == listed["meta"]["distributed"]


def test_streams_together_and_a_cancel(group: RankZero, expected: dict[str, list[str]]) -> None:
    client = group.openai()

    def streamed(prompt: str) -> list[str]:
        stream = client.chat.completions.create(
            model="x",
            messages=[{"role": "user", "content": prompt}],
            max_tokens=24,
            logprobs=True,
            stream=True,
            **GREEDY,
        )
        tokens = []
        for chunk in stream:
            if chunk.choices and chunk.choices[0].logprobs and chunk.choices[0].logprobs.content:
                tokens += [entry.token for entry in chunk.choices[0].logprobs.content]
        return tokens

    def cancelled() -> int:
        stream = client.completions.create(
            model="x", prompt="One two three", max_tokens=2000, stream=True, **GREEDY
        )
        received = 0
        for received, _ in enumerate(stream, start=1):
            if received == 5:
                break
        stream.close()
        return received

    tokens, cancels = group.generation_counts()
    with ThreadPoolExecutor(3) as pool:
        stopped = pool.submit(cancelled)
        answers = list(pool.map(streamed, PROMPTS))
    assert stopped.result() == 5
    assert answers == [expected[p] for p in PROMPTS]
    group.assert_cancelled_early(tokens, cancels, 2000)


def _streams_until_failure(group: RankZero, action: Any) -> tuple[dict[str, Any], float]:
    """Start a long stream, do `action` once tokens flow; the error event and its delay."""
    with (
        group.http() as http,
        http.stream(
            "POST",
            "/v1/completions",
            json={"prompt": "One two", "max_tokens": 100000, "stream": True, "ignore_eos": True},
        ) as response,
    ):
        assert response.status_code == 200
        lines = response.iter_lines()
        for line in lines:
            if line.startswith("data: {"):
                break
        acted = time.monotonic()
        action()
        for line in lines:
            if line.startswith("data: {") and '"error"' in line:
                return json.loads(line[6:])["error"], time.monotonic() - acted
    raise AssertionError("the stream ended without an error")


def _recovers(group: RankZero, expected: dict[str, list[str]]) -> None:
    client = group.openai()
    deadline = time.monotonic() + 120
    while True:
        try:
            assert _greedy(client, PROMPTS[1]) == expected[PROMPTS[1]]
            return
        except openai.APIStatusError as exc:
            # A reload right after a failure may be refused for a moment (Retry-After).
            assert exc.status_code == 503 and time.monotonic() < deadline, exc
            time.sleep(1)


def test_a_killed_rank_fails_the_stream_then_the_model_reloads(
    group: RankZero, rank1: subprocess.Popen[bytes], expected: dict[str, list[str]]
) -> None:
    session = _session(rank1)
    error, delay = _streams_until_failure(group, lambda: os.kill(session, signal.SIGKILL))
    assert error["code"] == "model_unavailable"
    assert "rank 1 (10.213.44.2)" in error["message"]
    assert delay < RANK_TIMEOUT + 5
    with group.http() as http:
        listed = http.get("/v1/models").json()["data"][0]
    assert listed["state"] == "failed" and "rank 1" in listed["reason"]
    _recovers(group, expected)


def test_a_stopped_rank_fails_the_stream_within_the_bound(
    group: RankZero, rank1: subprocess.Popen[bytes]
) -> None:
    session = _session(rank1)
    try:
        error, delay = _streams_until_failure(group, lambda: os.kill(session, signal.SIGSTOP))
    finally:
        os.kill(session, signal.SIGKILL)
    assert error["code"] == "model_unavailable"
    assert "rank 1 (10.213.44.2) did not finish a step within 5 s" in error["message"]
    assert RANK_TIMEOUT - 1 < delay < RANK_TIMEOUT + 5
    # Reloading after this is the killed rank's test's.


def test_a_split_the_model_cannot_take_is_refused_at_start(models: Path, hostfile: Path) -> None:
    # mlx-lm's Llama shards by tensor but has no pipeline.
    command = [MLXCEL, "serve", "-m", str(models / LLAMA_DIR), "--distributed", str(hostfile)]
    refused = subprocess.run(
        [*command, "--parallel-mode", "pipeline"], capture_output=True, text=True, timeout=60
    )
    assert refused.returncode == 2
    assert "llama models cannot be split by pipeline: use tensor" in refused.stderr


def test_a_config_files_distributed_section_is_checked(tmp_path: Path, hostfile: Path) -> None:
    config = tmp_path / "models.yaml"
    section = f"{{hostfile: {hostfile}, mode: sideways}}"
    config.write_text(f"models:\n  - model_path: {tmp_path}\n    distributed: {section}\n")
    refused = subprocess.run(
        [MLXCEL, "serve", "--config", str(config)], capture_output=True, text=True, timeout=60
    )
    assert refused.returncode == 2
    assert "models.yaml:3: models[0].distributed: mode must be one of auto" in refused.stderr
