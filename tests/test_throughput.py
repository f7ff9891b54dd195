"""Continuous batching, admission control, prefix reuse and metrics, over real HTTP."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.conftest import start
from tests.server_process import ServerProcess, metric_sum

pytestmark = pytest.mark.slow

LONG = {"max_tokens": 400, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def batched(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    proc = start(
        tmp_path_factory.mktemp("batched"),
        "--parallel",
        "2",
        "--queue-size",
        "1",
        "--queue-timeout",
        "1",
        "--ctx-size",
        "4096",
        # Small enough that a prompt of a few hundred tokens takes several steps.
        "--batch-size",
        "64",
    )
    yield proc
    proc.stop_soon()


def _client(server: ServerProcess) -> openai.OpenAI:
    return server.openai()


def _stream_times(
    server: ServerProcess, prompt: str, times: list[float], first: threading.Event | None = None
) -> None:
    stream = _client(server).completions.create(
        model="default",
        prompt=prompt,
        max_tokens=40,
        temperature=0,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    for _ in stream:
        times.append(time.monotonic())
        if first is not None:
            first.set()


def test_two_streams_progress_together(batched: ServerProcess) -> None:
    a: list[float] = []
    b: list[float] = []
    threads = [
        threading.Thread(target=_stream_times, args=(batched, "Once upon a time", a)),
        threading.Thread(target=_stream_times, args=(batched, "The weather today", b)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(a) >= 30 and len(b) >= 30
    # Interleaved: each stream receives tokens while the other is still running.
    assert a[0] < b[-1] and b[0] < a[-1]
    assert sum(b[0] < t < b[-1] for t in a) > 10


def test_batched_output_equals_solo_output(batched: ServerProcess) -> None:
    client = _client(batched)
    messages = [{"role": "user", "content": "Name three fruits."}]
    solo = (
        client.chat.completions.create(
            model="default", messages=messages, max_tokens=24, temperature=0
        )
        .choices[0]
        .message.content
    )
    results: list[str | None] = []

    running = threading.Event()

    def other() -> None:
        _stream_times(batched, "A long unrelated prompt about the sea", [], running)

    thread = threading.Thread(target=other)
    thread.start()
    assert running.wait(120)
    results.append(
        client.chat.completions.create(
            model="default", messages=messages, max_tokens=24, temperature=0
        )
        .choices[0]
        .message.content
    )
    thread.join()
    assert results == [solo]


@contextlib.contextmanager
def _decoding(server: ServerProcess) -> Iterator[Iterator[str]]:
    """A stream of up to 2,000 tokens that has begun; its lines to come. Closing it ends it."""
    with (
        server.http() as http,
        http.stream(
            "POST",
            "/v1/completions",
            json={"prompt": "Count:", "stream": True, **LONG, "max_tokens": 2000},
        ) as response,
    ):
        lines = response.iter_lines()
        next(lines)
        yield lines


def _read(server: ServerProcess, names: tuple[str, ...]) -> list[float]:
    """Samples of one /metrics page, so that they agree with each other."""
    with server.http() as http:
        page = http.get("/metrics").text
    return [metric_sum(page, name) for name in names]


def test_a_long_prompt_never_stalls_a_decoding_stream(batched: ServerProcess) -> None:
    """A prompt admitted while another stream decodes is evaluated in chunks that share each
    step with the decoding stream: that stream gets a token from every step."""
    names = ("mlxcel_decode_steps_total", "mlxcel_prompt_steps_total")
    names += ("mlxcel_generation_tokens_total",)
    with _decoding(batched), batched.http() as http:
        before = _read(batched, names)
        prompt = " ".join(["river", "stone", "cloud"] * 80)
        answer = http.post("/v1/completions", json={"prompt": prompt, "max_tokens": 1})
        assert answer.status_code == 200, answer.text
        prompt_tokens = answer.json()["usage"]["prompt_tokens"]
    while batched.metric("mlxcel_requests_running"):
        time.sleep(0.01)
    steps, prompt_steps, generated = (
        new - old for new, old in zip(_read(batched, names), before, strict=True)
    )
    # The prompt took several chunks: the batch holds 64 tokens, and beside another running
    # stream a step feeds at most half of them from prompts.
    assert prompt_steps >= prompt_tokens // 32 >= 6
    # Every step gave the decoding stream a token (one of the tokens is the prompt's answer);
    # the first reading may fall between a step and its tokens, hence one of slack.
    assert abs(steps - (generated - 1)) <= 1


def test_queue_full_and_queue_timeout(batched: ServerProcess) -> None:
    started = threading.Barrier(3)
    stops: list[httpx.Response] = []

    def hold_slot() -> None:
        # Long enough to outlast both waiters below; stopped once they are done.
        with _decoding(batched) as lines:
            started.wait()
            for _ in lines:
                if stops:
                    break

    holders = [threading.Thread(target=hold_slot) for _ in range(2)]
    for thread in holders:
        thread.start()
    started.wait()
    waited: list[httpx.Response] = []
    waiter = threading.Thread(
        target=lambda: waited.append(
            batched.http().post("/v1/completions", json={"prompt": "hi", "max_tokens": 2})
        )
    )
    waiter.start()
    while not batched.metric("mlxcel_requests_waiting"):
        time.sleep(0.01)
    with batched.http() as http:
        full = http.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2})
    assert full.status_code == 503
    assert full.json()["error"]["type"] == "server_busy"
    assert full.headers["retry-after"]
    waiter.join()
    assert waited[0].status_code == 503
    assert "waited" in waited[0].json()["error"]["message"]
    # A streamed Responses request that waits too long gets its 503 before the first byte too.
    with batched.http() as http:
        body = {"input": "hi", "max_output_tokens": 2, "stream": True}
        streamed = http.post("/v1/responses", json=body)
    assert streamed.status_code == 503, streamed.text
    assert streamed.json()["error"]["type"] == "server_busy"
    stops.append(full)
    for thread in holders:
        thread.join()
    with batched.http() as http:
        assert (
            http.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2}).status_code == 200
        )


def test_repeated_and_multi_turn_prompts_reuse_the_cache(batched: ServerProcess) -> None:
    client = _client(batched)
    history = [
        {"role": "system", "content": "You are a helpful assistant. " * 20},
        {"role": "user", "content": "Tell me about the moon."},
    ]
    first = client.chat.completions.create(
        model="default", messages=history, max_tokens=16, temperature=0
    )
    again = client.chat.completions.create(
        model="default", messages=history, max_tokens=16, temperature=0
    )
    assert again.usage is not None and first.usage is not None
    details = again.usage.prompt_tokens_details
    assert details is not None and details.cached_tokens
    assert details.cached_tokens >= first.usage.prompt_tokens - 1
    history += [
        {"role": "assistant", "content": first.choices[0].message.content or ""},
        {"role": "user", "content": "And the sun?"},
    ]
    turn = client.chat.completions.create(
        model="default", messages=history, max_tokens=8, temperature=0
    )
    assert turn.usage is not None and turn.usage.prompt_tokens_details is not None
    assert (turn.usage.prompt_tokens_details.cached_tokens or 0) >= first.usage.prompt_tokens - 1
    assert turn.choices[0].message.content


def test_metrics_and_slots(batched: ServerProcess) -> None:
    names = (
        "mlxcel_generation_tokens_total",
        "mlxcel_prompt_tokens_total",
        "mlxcel_requests_finished_total",
        "mlxcel_time_to_first_token_seconds_count",
    )
    before = [batched.metric(name) for name in names]
    _client(batched).completions.create(model="default", prompt="Hello", max_tokens=5)
    after = [batched.metric(name) for name in names]
    for name, old, new in zip(names, before, after, strict=True):
        assert new > old, name
    with batched.http() as http:
        assert "mlxcel_prefix_cache_hit_ratio{" in http.get("/metrics").text
    with batched.http() as http:
        slots = http.get("/slots").json()
    assert [s["id"] for s in slots] == [0, 1]
    assert all(s["n_ctx"] == 2048 for s in slots)
    assert all(not s["is_processing"] for s in slots)
