"""Images on an M-RoPE model over HTTP: a tiny random-weight Qwen2-VL-style GGUF (arch
qwen2vl) with a `qwen2vl_merger` projector (bench/mrope_models.py).

Such a model lays an image's tokens on its grid (four positions a token) and moves the
sequence's position past it by the grid's longer side, not its token count, so after an
image positions are not token indices. The tests check what depends on that: a prompt whose
image prefix comes from the slot or from the prompt cache answers as one evaluated whole.
Random weights say nothing sensible: they assert log-probabilities and counts, never words.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import openai
import pytest
from bench.models import SHAPES, build, tiny
from bench.mrope_models import MropeShape
from bench.mrope_models import build as build_projector

from mlxcel.engine.positions import Jumps
from tests.conftest import serving
from tests.media_util import data_uri, image_bytes
from tests.server_process import ServerProcess

# The model build and the server start take most of a minute on a loaded machine.
pytestmark = pytest.mark.slow

# Qwen2-VL's text model cut down, with the default model's vocabulary (a quick build).
TEXT = replace(tiny(SHAPES["qwen2-vl-2b"]), vocab=SHAPES["smollm2-135m"].vocab)
PROJECTOR = MropeShape(TEXT.hidden)
# A side of one merged token in pixels: an image of 4 x 2 of them is 8 tokens, 4 positions.
CELL = 2 * PROJECTOR.patch_size
WIDE = image_bytes(size=(4 * CELL, 2 * CELL))
OTHER = image_bytes(size=(4 * CELL, 2 * CELL), color=120)


@pytest.fixture(scope="module")
def mrope(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("mrope-model")
    text: Path = build(TEXT, root).path
    yield from serving(
        tmp_path_factory, "mrope",
        "-m", str(text), "--mmproj", str(build_projector(PROJECTOR, root)),
        "--ctx-size", "1024", "--cache-ram", "64",
    )  # fmt: skip


def turn(url: str, text: str = "Describe:") -> list[dict[str, Any]]:
    content = [{"type": "text", "text": text}, {"type": "image_url", "image_url": {"url": url}}]
    return [{"role": "user", "content": content}]


def ask(client: openai.OpenAI, messages: list[dict[str, Any]], **extra: Any) -> Any:
    return client.chat.completions.create(
        model="m", messages=messages, max_tokens=3, temperature=0, logprobs=True,
        top_logprobs=3, **extra,
    )  # fmt: skip


def logprobs(answer: Any) -> list[list[tuple[str, float]]]:
    """Every generated token's top log-probabilities."""
    return [
        [(t.token, t.logprob) for t in step.top_logprobs]
        for step in answer.choices[0].logprobs.content
    ]


def same(first: Any, second: Any) -> bool:
    """Whether two answers saw the same prompt: the same top tokens, log-probabilities within
    the float noise of another batch split (positions off by an image's jump move them by
    0.005 and more on this model)."""
    steps = zip(logprobs(first), logprobs(second), strict=True)
    pairs = [pair for a, b in steps for pair in zip(a, b, strict=True)]
    return all(ta == tb and abs(x - y) < 1e-3 for (ta, x), (tb, y) in pairs)


def cached(answer: Any) -> int:
    details = answer.usage.prompt_tokens_details
    return int(details.cached_tokens or 0) if details is not None else 0


def fresh(client: openai.OpenAI, messages: list[dict[str, Any]]) -> Any:
    """The answer with the whole prompt evaluated from its first token."""
    answer = ask(client, messages, extra_body={"cache_prompt": False})
    assert cached(answer) == 0
    return answer


def follow_up(messages: list[dict[str, Any]], answer: Any) -> list[dict[str, Any]]:
    reply = {"role": "assistant", "content": answer.choices[0].message.content or ""}
    return [*messages, reply, {"role": "user", "content": "And then?"}]


def test_the_model_is_served_with_mrope_images(mrope: ServerProcess) -> None:
    client = mrope.openai()
    none = ask(client, [{"role": "user", "content": "Describe:"}]).usage.prompt_tokens
    wide = ask(client, turn(data_uri(WIDE))).usage.prompt_tokens
    square = ask(client, turn(data_uri(image_bytes(size=(4 * CELL, 4 * CELL))))).usage
    # Tokens follow the image's grid (4 x 2 merged cells, then 4 x 4), markers aside.
    assert wide - none >= 8
    assert square.prompt_tokens - wide == 8


def test_same_image_same_answer_other_image_other_logprobs(mrope: ServerProcess) -> None:
    client = mrope.openai()
    first = logprobs(fresh(client, turn(data_uri(WIDE))))
    assert logprobs(fresh(client, turn(data_uri(WIDE)))) == first
    assert logprobs(fresh(client, turn(data_uri(OTHER)))) != first


def test_a_follow_up_on_the_slots_image_prefix_answers_as_a_fresh_prompt(
    mrope: ServerProcess,
) -> None:
    client = mrope.openai()
    messages = turn(data_uri(WIDE), "What is this?")
    later = follow_up(messages, ask(client, messages))
    reused = ask(client, later)
    # The slot held the image turn: the follow-up decodes only its new tokens, at positions
    # after the image's, and sees what a prompt evaluated whole sees.
    assert cached(reused) > PROJECTOR.patch_size
    assert same(reused, fresh(client, later))


def test_an_image_prefix_loaded_from_the_prompt_cache_answers_as_a_fresh_prompt(
    mrope: ServerProcess,
) -> None:
    client = mrope.openai()
    messages = turn(data_uri(OTHER), "Look closely at this picture, please:")
    later = follow_up(messages, ask(client, messages))
    # Another long prompt takes the one slot; the image turn goes to the prompt cache.
    ask(client, [{"role": "user", "content": "Count the stars in the sky. " * 8}])
    loads = mrope.metric("mlxcel_prompt_cache_ram_loads_total")
    reused = ask(client, later)
    assert mrope.metric("mlxcel_prompt_cache_ram_loads_total") == loads + 1
    assert cached(reused) > PROJECTOR.patch_size
    assert same(reused, fresh(client, later))


def test_a_text_request_after_an_image_in_the_same_slot(mrope: ServerProcess) -> None:
    client = mrope.openai()
    text = [{"role": "user", "content": "Describe: nothing at all."}]
    alone = fresh(client, text)
    ask(client, turn(data_uri(WIDE)))
    assert same(ask(client, text), alone)


def test_streaming_an_mrope_image_matches_the_whole_answer(mrope: ServerProcess) -> None:
    client = mrope.openai()
    messages = turn(data_uri(OTHER), "Stream it:")
    whole = fresh(client, messages)
    chunks = list(
        client.chat.completions.create(
            model="m", messages=messages, max_tokens=3, temperature=0, stream=True,
            stream_options={"include_usage": True}, extra_body={"cache_prompt": False},
        )
    )  # fmt: skip
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    usage = chunks[-1].usage
    assert usage is not None and usage.prompt_tokens == whole.usage.prompt_tokens


def test_jumps_map_token_indices_to_positions_and_survive_the_prompt_cache() -> None:
    jumps = Jumps()
    jumps.advance(start=5, n_tokens=8, n_pos=4)  # tokens 5..12 at positions 5..8
    jumps.advance(start=12, n_tokens=6, n_pos=3)  # token 16 is at position 12
    assert [jumps.position(i) for i in (0, 5, 13, 16, 22, 30)] == [0, 5, 9, 12, 15, 23]
    loaded, size = Jumps.from_bytes(jumps.to_bytes() + b"state")
    assert size == len(jumps.to_bytes()) and loaded.position(30) == 23
    loaded.keep(15)
    assert loaded.position(30) == 26
