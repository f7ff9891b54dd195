"""Admission: a request is admitted whole or refused whole, nothing runs for a refused or
failed request, and a client that leaves (queued or running, streaming or not) is removed at
once. Ends with a bounded load test at four times the server's capacity."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import serving
from tests.server_process import ServerProcess, metric_sum

# Two slots and four queue places: six sequences at most, running or waiting.
SLOTS, QUEUE = 2, 4
CAPACITY = SLOTS + QUEUE
FLAGS = ("-np", str(SLOTS), "--queue-size", str(QUEUE), "--ctx-size", "4096")
# A generation long enough to be still running when the test acts on it (2048 tokens a slot).
LONG = 1500
SHORT = 8
MESSAGES = [{"role": "user", "content": "Tell me a story."}]
# Resident memory the load test may leave behind (measured here: +11 MiB on a fresh server).
MEMORY_SLACK = 64 << 20


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The default model with room for six sequences."""
    yield from serving(tmp_path_factory, "small", *FLAGS)


def _completion(max_tokens: int, **body: Any) -> dict[str, Any]:
    return {"prompt": "Once upon a time", "max_tokens": max_tokens, "ignore_eos": True, **body}


class Watch:
    """/metrics of one server, read without blocking the event loop."""

    def __init__(self, server: ServerProcess) -> None:
        self.server = server

    async def metric(self, name: str, **labels: str) -> float:
        async with httpx.AsyncClient(base_url=self.server.root, timeout=30) as http:
            return metric_sum((await http.get("/metrics")).text, name, **labels)

    async def until(self, what: str, check: Callable[[float], bool], **labels: str) -> None:
        """Wait until `check` holds for a metric; fail after a minute."""
        for _ in range(1200):
            if check(await self.metric(what, **labels)):
                return
            await asyncio.sleep(0.05)
        raise AssertionError(f"{what} never got there: {await self.metric(what, **labels)}")

    async def counts(self) -> tuple[float, float, float]:
        """Tokens generated, requests cancelled, requests that ran to their length limit."""
        finished = "mlxcel_requests_finished_total"
        return (
            await self.metric("mlxcel_generation_tokens_total"),
            await self.metric(finished, reason="cancelled"),
            await self.metric(finished, reason="length"),
        )


async def _stream(server: ServerProcess, path: str, body: dict[str, Any]) -> list[Any]:
    """A whole SSE answer: each `data:` payload, parsed ("[DONE]" kept as the string)."""
    async with (
        httpx.AsyncClient(base_url=server.root, timeout=120) as http,
        http.stream("POST", path, json={**body, "stream": True}) as response,
    ):
        if response.status_code != 200:
            await response.aread()
            raise Refused(response)
        payloads: list[Any] = []
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                data = line.removeprefix("data: ")
                payloads.append(data if data == "[DONE]" else json.loads(data))
        return payloads


async def _post(server: ServerProcess, path: str, body: dict[str, Any]) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=server.root, timeout=120) as http:
        response = await http.post(path, json=body)
    if response.status_code != 200:
        raise Refused(response)
    answer: dict[str, Any] = response.json()
    return answer


async def _read_forever(server: ServerProcess) -> None:
    """A streamed generation that runs until the task is cancelled (the client leaves)."""
    await _stream(server, "/v1/completions", _completion(LONG))


async def _read_chunks(server: ServerProcess, chunks: int) -> None:
    """Read a few chunks of a long stream, then leave."""
    async with (
        httpx.AsyncClient(base_url=server.root, timeout=120) as http,
        http.stream("POST", "/v1/completions", json=_completion(LONG, stream=True)) as response,
    ):
        if response.status_code != 200:
            await response.aread()
            raise Refused(response)
        seen = 0
        async for line in response.aiter_lines():
            seen += line.startswith("data: ")
            if seen == chunks:
                return


class Refused(Exception):
    """The server answered with an error status."""

    def __init__(self, response: httpx.Response) -> None:
        super().__init__(f"{response.status_code}: {response.text}")
        self.response = response


def _assert_busy(response: httpx.Response) -> None:
    assert response.status_code == 503, response.text
    assert response.json()["error"]["code"] == "server_busy"
    assert response.headers["Retry-After"]


async def _cancel(tasks: list[asyncio.Task[Any]]) -> None:
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task


def _run(scenario: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(scenario())  # type: ignore[arg-type]


def test_a_request_with_more_choices_than_room_is_refused_whole(small: ServerProcess) -> None:
    async def scenario() -> None:
        watch = Watch(small)
        before = await watch.counts()
        prompts = await watch.metric("mlxcel_prompt_tokens_total")
        with pytest.raises(Refused) as chat:
            await _post(
                small,
                "/v1/chat/completions",
                {"messages": MESSAGES, "n": 8, "max_tokens": 64, "ignore_eos": True},
            )
        _assert_busy(chat.value.response)
        listed = _completion(64, prompt=["Once upon a time"] * (CAPACITY + 1))
        with pytest.raises(Refused) as completions:
            await _post(small, "/v1/completions", listed)
        _assert_busy(completions.value.response)
        with pytest.raises(Refused) as streamed:
            await _stream(small, "/v1/completions", listed)
        _assert_busy(streamed.value.response)
        # Nothing of the refused requests ever started.
        assert await watch.metric("mlxcel_prompt_tokens_total") == prompts
        await watch.until("mlxcel_requests_running", lambda n: n == 0)
        assert await watch.counts() == before
        assert "needs 8 sequences" in chat.value.response.json()["error"]["message"]
        # A request that fits runs whole: every choice to its limit.
        whole = await _post(
            small, "/v1/completions", _completion(SHORT, prompt=["Once upon a time"] * CAPACITY)
        )
        assert sorted(c["index"] for c in whole["choices"]) == list(range(CAPACITY))
        assert {c["finish_reason"] for c in whole["choices"]} == {"length"}
        assert whole["usage"]["completion_tokens"] == CAPACITY * SHORT

    _run(scenario)


def test_clients_that_leave_the_queue_free_their_places_at_once(small: ServerProcess) -> None:
    async def scenario() -> None:
        watch = Watch(small)
        _, cancelled, _ = await watch.counts()
        blockers = [asyncio.ensure_future(_read_forever(small)) for _ in range(SLOTS)]
        await watch.until("mlxcel_requests_running", lambda n: n == SLOTS)
        chat = {"messages": MESSAGES, "max_tokens": SHORT, "ignore_eos": True}
        queued = [
            asyncio.ensure_future(_stream(small, "/v1/chat/completions", chat)),
            asyncio.ensure_future(_stream(small, "/v1/completions", _completion(SHORT))),
            asyncio.ensure_future(_post(small, "/v1/chat/completions", chat)),
            asyncio.ensure_future(_post(small, "/v1/completions", _completion(SHORT))),
        ]
        await watch.until("mlxcel_requests_waiting", lambda n: n == QUEUE)
        await _cancel(queued)
        # Their places are free while both slots still run: new clients get them.
        await watch.until("mlxcel_requests_waiting", lambda n: n == 0)
        assert await watch.metric("mlxcel_requests_running") == SLOTS
        assert (await watch.counts())[1] == cancelled + QUEUE
        after = [
            asyncio.ensure_future(_stream(small, "/v1/chat/completions", chat)),
            asyncio.ensure_future(_post(small, "/v1/completions", _completion(SHORT))),
        ]
        await watch.until("mlxcel_requests_waiting", lambda n: n == len(after))
        await _cancel(blockers)
        streamed, whole = await asyncio.gather(*after)
        assert streamed[-1] == "[DONE]"
        assert whole["usage"]["completion_tokens"] == SHORT
        await watch.until("mlxcel_requests_running", lambda n: n == 0)
        assert (await watch.counts())[1] == cancelled + QUEUE + SLOTS

    _run(scenario)


@pytest.fixture(scope="module")
def impatient(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """Two slots, and a request that waits a second for one gets 503."""
    yield from serving(
        tmp_path_factory, "impatient", "-np", "2", "--queue-timeout", "1", "--ctx-size", "4096"
    )


def test_a_choice_that_fails_stops_the_choices_that_run(impatient: ServerProcess) -> None:
    async def scenario() -> None:
        watch = Watch(impatient)
        tokens, cancelled, _ = await watch.counts()
        blocker = asyncio.ensure_future(_read_forever(impatient))
        await watch.until("mlxcel_requests_running", lambda n: n == 1)
        # Choice 0 takes the free slot; choice 1 waits past the queue timeout: 503.
        with pytest.raises(Refused) as refused:
            await _post(impatient, "/v1/completions", _completion(LONG, n=2))
        _assert_busy(refused.value.response)
        await _cancel([blocker])
        await watch.until("mlxcel_requests_running", lambda n: n == 0)
        now_tokens, now_cancelled, _ = await watch.counts()
        # The blocker and choice 0 were cancelled; neither ran to its limit.
        assert now_cancelled == cancelled + 2
        assert now_tokens - tokens < 2 * LONG

    _run(scenario)


# The load test: four times the capacity at once, in waves, every kind of client mixed.
WAVES = 3
CLIENTS = 4 * CAPACITY


async def _client(server: ServerProcess, kind: int) -> str:
    """One client of the load test; what became of it."""
    chat = {"messages": MESSAGES, "max_tokens": SHORT, "ignore_eos": True}
    try:
        if kind == 0:
            answer = await _post(server, "/v1/completions", _completion(SHORT))
            assert answer["choices"][0]["finish_reason"] == "length"
            assert answer["usage"]["completion_tokens"] == SHORT
        elif kind == 1:
            chunks = await _stream(server, "/v1/chat/completions", chat)
            assert chunks[-1] == "[DONE]"
            reasons = [c["choices"][0]["finish_reason"] for c in chunks[:-1] if c["choices"]]
            assert reasons[-1] == "length"
        elif kind == 2:
            await _read_chunks(server, 2)
            return "left mid-stream"
        else:
            # Leaves after half a second, wherever it is: queued or generating.
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(_post(server, "/v1/completions", _completion(LONG)), 0.5)
            return "left"
    except Refused as exc:
        _assert_busy(exc.response)
        return "refused"
    return "completed"


def test_load_at_four_times_capacity(small: ServerProcess) -> None:
    async def scenario() -> None:
        watch = Watch(small)
        tokens, cancelled, length = await watch.counts()
        baseline = small.resident_bytes()
        outcomes: Counter[tuple[int, str]] = Counter()
        for _ in range(WAVES):
            kinds = [i % 4 for i in range(CLIENTS)]
            results = await asyncio.gather(*(_client(small, kind) for kind in kinds))
            outcomes.update(zip(kinds, results, strict=True))
            await watch.until("mlxcel_requests_running", lambda n: n == 0)
        await watch.until("mlxcel_requests_waiting", lambda n: n == 0)
        by_result = Counter[str]()
        for (_, result), count in outcomes.items():
            by_result[result] += count
        grown = small.resident_bytes() - baseline
        print(
            f"\nload test, {WAVES} waves of {CLIENTS} clients: {dict(by_result)}; "
            f"resident memory {grown / 2**20:+.1f} MiB"
        )
        # Nothing a request held stays behind it: no more than allocator noise on top.
        assert grown < MEMORY_SLACK
        completed = sum(n for (_, result), n in outcomes.items() if result == "completed")
        leavers = sum(
            n for (kind, result), n in outcomes.items() if kind >= 2 and result != "refused"
        )
        assert by_result["refused"] > 0 and completed > 0
        now_tokens, now_cancelled, now_length = await watch.counts()
        # Every completed request ran to its limit, and no leaver did: each was cancelled
        # (one that left before its body was read never reached the engine).
        assert now_length - length == completed
        assert by_result["left mid-stream"] <= now_cancelled - cancelled <= leavers
        assert now_tokens - tokens < completed * SHORT + leavers * LONG

    _run(scenario)
