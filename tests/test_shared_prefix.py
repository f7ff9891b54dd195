"""A request whose prompt shares a long prefix with a running request's: the busy slot's KV
state is copied into its free slot (engine/sharing.py), so the prefix is not evaluated again,
and the answers are what each request gets alone."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from mlxcel.engine.sharing import MIN_GAIN
from tests.conftest import on_each_engine, start
from tests.server_process import ServerProcess

PREFIX = " ".join(f"Rule {i}: keep the {w} dry." for i, w in enumerate(["sail", "rope"] * 40))


@pytest.fixture(scope="module", params=["llamacpp", "mlx"])
def server(request: pytest.FixtureRequest) -> Iterator[ServerProcess]:
    """Two slots on each engine: llama.cpp copies a slot's KV buffer, MLX a saved state."""
    proc = on_each_engine(request, "-np", "2", "--cache-ram", "0")
    yield proc
    proc.stop_soon()


def _body(prompt: str, max_tokens: int, **more: Any) -> dict[str, Any]:
    return {
        "model": "default",
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        **more,
    }


def _complete(client: httpx.Client, prompt: str, **more: Any) -> tuple[str, int]:
    """The greedy answer of 12 tokens, and how many prompt tokens came from a cache."""
    answer = client.post("/v1/completions", json=_body(prompt, 12, **more)).json()
    details = answer["usage"].get("prompt_tokens_details") or {}
    return answer["choices"][0]["text"], details.get("cached_tokens") or 0


def test_a_prefix_in_a_busy_slot_is_copied_not_evaluated_again(server: ServerProcess) -> None:
    with server.http() as client:
        prefix = client.post("/tokenize", json={"content": PREFIX}).json()["tokens"]
        assert len(prefix) > 4 * MIN_GAIN
        first, second = PREFIX + " Story one:", PREFIX + " Story two:"
        running = ""
        body = _body(first, 160, stream=True)
        with client.stream("POST", "/v1/completions", json=body) as stream:
            lines = stream.iter_lines()
            # The first request is past its prompt and decoding in slot 0 ...
            while not running:
                line = next(lines)
                if line.startswith("data: {"):
                    running = line
            # ... when the second, sharing its prefix, takes slot 1.
            beside, cached = _complete(client, second)
            rest = [line for line in lines if line.startswith("data: {")]
        assert rest, "the first request ended before the second was answered"
        assert cached >= len(prefix) - 2
        # Evaluated from its first token, with no cache, the second prompt answers the same.
        alone, none_cached = _complete(client, second, cache_prompt=False)
        assert none_cached == 0
        assert beside == alone


def test_a_short_shared_prefix_is_not_copied(server: ServerProcess) -> None:
    with server.http() as client:
        long_prompt = "Alpha beta gamma. " * 60 + "Now a story:"
        body = _body(long_prompt, 120, stream=True)
        with client.stream("POST", "/v1/completions", json=body) as stream:
            lines = stream.iter_lines()
            while not next(lines).startswith("data: {"):
                pass
            # Shares a few tokens with the running prompt: not worth a copy of the slot.
            _, cached = _complete(client, "Alpha beta gamma. Something else entirely.")
            list(lines)
        assert cached < MIN_GAIN


def test_prompts_arriving_together_evaluate_their_prefix_once(server: ServerProcess) -> None:
    """One request's two prompts are queued together: the second waits for the first's
    prompt to be evaluated and copies it, rather than evaluating the same prefix beside it.
    (Its answer may differ from one evaluated alone in the last bits, as a prompt evaluated
    in other chunks does on llama.cpp: the copy's own correctness is the test above.)"""
    # A prefix no slot holds yet (the server keeps no prompt cache in host memory).
    fresh = PREFIX.replace("Rule", "Law")
    with server.http() as client:
        prefix = client.post("/tokenize", json={"content": fresh}).json()["tokens"]
        prompts = [fresh + " Story three:", fresh + " Story four:"]
        answer = client.post("/v1/completions", json=_body(prompts, 12)).json()
    # Evaluated together, neither would have any cached.
    assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] >= len(prefix) - 2
    assert answer["usage"]["completion_tokens"] == 24
    assert sorted(choice["index"] for choice in answer["choices"]) == [0, 1]


def test_a_window_that_cannot_be_cut_back_is_not_copied(
    models: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A model with a sliding-window layer: a copy of a slot could not be cut back to the
    shared prefix and would be evaluated again, so prompts arriving together neither wait nor
    copy, and answer as they do alone."""
    pytest.importorskip("mlx_lm")
    from tests.test_mlx_batching import _sliding_window

    tmp = tmp_path_factory.mktemp("window")
    model = _sliding_window(models, tmp / "model")
    server = start(tmp, "-m", str(model), "--backend", "mlx", "-np", "2", "--cache-ram", "0")
    try:
        with server.http() as client:
            prompts = [PREFIX + " Story five:", PREFIX + " Story six:"]
            answer = client.post("/v1/completions", json=_body(prompts, 12)).json()
            alone = [_complete(client, p, cache_prompt=False)[0] for p in prompts]
    finally:
        server.stop_soon()
    assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    by_index = sorted(answer["choices"], key=lambda choice: choice["index"])
    assert [choice["text"] for choice in by_index] == alone
