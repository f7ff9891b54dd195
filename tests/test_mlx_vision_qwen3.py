"""Images on Qwen3-VL on the MLX engine over HTTP: a tiny random-weight Qwen3-VL
(tests/mlx_qwen3vl.py) loaded through mlx-vlm.

Qwen3-VL lays an image on its M-RoPE grid as Qwen2-VL does (its sections interleaved, which
the model's rotary embedding does from the same position ids) and adds deepstack features,
merged from two vision blocks, into the hidden states of its first two decoder layers at the
image's tokens. The reference is mlx-vlm's own generate on the same prompt and image. Random
weights say nothing sensible: the tests assert counts and log-probabilities, never words.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import openai
import pytest
from PIL import Image

from tests.conftest import applied_prompt, serving
from tests.media_util import data_uri
from tests.mlx_qwen2vl import grid
from tests.mlx_qwen3vl import build_qwen3vl_model
from tests.server_process import ServerProcess
from tests.test_mlx_vision_mrope import (
    CELL,
    OTHER,
    TALL,
    WIDE,
    alone_and_together,
    ask,
    logprobs,
    turn,
)

# Building the model and starting its server takes most of a minute on a busy 2-core machine.
pytestmark = pytest.mark.slow

STEPS = 4
"""The tokens `ask` has answered."""


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_qwen3vl_model(tmp_path_factory.mktemp("mlx-qwen3vl") / "tiny-qwen3-vl")


@pytest.fixture(scope="module")
def qwen3vl(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Iterator[ServerProcess]:
    yield from serving(
        tmp_path_factory, "mlx-qwen3vl", "-m", str(model_dir), "--alias", "m", "-c", "1024",
        "-np", "2",
    )  # fmt: skip


def test_image_tokens_are_counted_and_images_told_apart(qwen3vl: ServerProcess) -> None:
    client = qwen3vl.openai()
    none = ask(client).usage.prompt_tokens
    rows, columns = grid(4 * CELL, 2 * CELL)
    wide = ask(client, WIDE)
    # The merged grid's tokens between the vision start and end tokens.
    assert wide.usage.prompt_tokens - none == rows * columns + 2
    assert logprobs(ask(client, OTHER))[0] != logprobs(wide)[0]


def _generate(model_dir: Path, prompt: str, picture: bytes) -> list[list[float]]:
    """mlx-vlm's greedy generate of the prompt: each step's top 3 log-probabilities."""
    from mlx_vlm.generate.dispatch import stream_generate
    from mlx_vlm.utils import load_model, load_processor

    model = load_model(model_dir)
    processor = load_processor(model_dir, add_detokenizer=True)
    path = model_dir.parent / "picture.png"
    Image.open(io.BytesIO(picture)).save(path)
    text = prompt.replace("<__media__>", "<|vision_start|><|image_pad|><|vision_end|>")
    generated = stream_generate(
        model, processor, text, [str(path)], max_tokens=STEPS, temperature=0.0
    )
    # Its last response, the summary, repeats the last token's.
    steps = [np.array(step.logprobs.astype(mx.float32)) for step in generated][:STEPS]
    return [sorted(step.tolist(), reverse=True)[:3] for step in steps]


def _without_deepstack(model_dir: Path, prompt: str, picture: bytes) -> list[float]:
    """The prompt's next-token top 3 log-probabilities from mlx-vlm's forward with the
    deepstack features left out (what serving without them would compute)."""
    from mlx_vlm.utils import load_model, load_processor

    model = load_model(model_dir)
    processor = load_processor(model_dir, add_detokenizer=False)
    text = prompt.replace("<__media__>", "<|vision_start|><|image_pad|><|vision_end|>")
    inputs = processor(text=text, images=[Image.open(io.BytesIO(picture)).convert("RGB")])
    arrays = {key: mx.array(np.asarray(inputs[key])) for key in ("pixel_values", "image_grid_thw")}
    ids = mx.array(np.asarray(inputs["input_ids"]))
    features = model.get_input_embeddings(ids, **arrays)
    out = model.language_model(
        ids, inputs_embeds=features.inputs_embeds, position_ids=features.position_ids
    )
    logits = out.logits[0, -1].astype(mx.float32)
    return sorted(np.array(logits - mx.logsumexp(logits)).tolist(), reverse=True)[:3]


def test_greedy_answer_is_mlx_vlms_generate(qwen3vl: ServerProcess, model_dir: Path) -> None:
    answer = ask(qwen3vl.openai(), WIDE)
    served = [[t.logprob for t in step.top_logprobs] for step in answer.choices[0].logprobs.content]
    prompt = applied_prompt(qwen3vl, turn(WIDE), add_generation_prompt=True)
    expected = _generate(model_dir, prompt, WIDE)
    assert len(served) == len(expected) == STEPS
    assert np.allclose(served, expected, atol=1e-3)
    # Without the deepstack features the model answers otherwise: the check can tell.
    assert not np.allclose(_without_deepstack(model_dir, prompt, WIDE), expected[0], atol=1e-3)


def test_alone_and_batched_answers_match(qwen3vl: ServerProcess) -> None:
    alone, together = alone_and_together(qwen3vl.openai(), WIDE, TALL)
    assert together == alone


def _picture_then(client: openai.OpenAI, picture: bytes, text: str, **extra: Any) -> Any:
    """A greedy answer to the picture followed by `text` (`extra`: llama-server's fields)."""
    image = {"type": "image_url", "image_url": {"url": data_uri(picture)}}
    messages = [{"role": "user", "content": [image, {"type": "text", "text": text}]}]
    return client.chat.completions.create(
        model="m", messages=messages, max_tokens=4, temperature=0, logprobs=True, top_logprobs=3,
        extra_body=extra,
    )  # fmt: skip


def _split(answer: Any) -> tuple[list[list[str]], list[list[float]]]:
    """Each step's top tokens, and their log-probabilities."""
    steps = logprobs(answer)
    return [[t for t, _ in step] for step in steps], [[v for _, v in step] for step in steps]


def test_a_prefix_with_an_image_comes_back_from_the_prompt_cache(qwen3vl: ServerProcess) -> None:
    client = qwen3vl.openai()
    loads = qwen3vl.metric("mlxcel_prompt_cache_ram_loads_total")
    first = _picture_then(client, WIDE, "Tell me about the river and the old king:", id_slot=0)
    # Another image in the same slot: the first prompt's state (past the image's start) is
    # saved to host memory.
    _picture_then(client, OTHER, "Tell me about the river and the old king:", id_slot=0)
    cached = _picture_then(client, WIDE, "Tell me about the river and the dragon:", id_slot=1)
    assert qwen3vl.metric("mlxcel_prompt_cache_ram_loads_total") == loads + 1
    reused = cached.usage.prompt_tokens_details.cached_tokens
    # The template's opening, the image between its start and end tokens, the shared words.
    assert reused > 8 + 2 and reused < first.usage.prompt_tokens
    assert cached.model_extra["timings"]["cache_n"] == reused
    fresh = _picture_then(
        client, WIDE, "Tell me about the river and the dragon:", id_slot=1, cache_prompt=False
    )
    assert fresh.usage.prompt_tokens_details.cached_tokens == 0
    # The tokens after the image continue at its grid's positions: the same answer.
    (tokens, values), (fresh_tokens, fresh_values) = _split(cached), _split(fresh)
    assert tokens == fresh_tokens and np.allclose(values, fresh_values, atol=1e-4)
