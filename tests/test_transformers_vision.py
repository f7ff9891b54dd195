"""A Hugging Face Qwen2-VL folder on the transformers backend over HTTP: the tiny
random-weight model of tests/hf_qwen2vl.py, served with `--backend transformers`.

The reference is transformers' own generate on the same image and prompt (its processor's
pixels, its image tokens expanded, its M-RoPE positions from get_rope_index). Random weights
say nothing sensible: the tests assert counts, token equality and log-probabilities.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from PIL import Image

from tests.conftest import applied_prompt, serving
from tests.hf_qwen2vl import build_hf_qwen2vl_model
from tests.media_util import image_bytes
from tests.mlx_qwen2vl import MERGE, PATCH, grid
from tests.server_process import ServerProcess

# The same requests and readings as the tiny Qwen2-VL on mlx-vlm.
from tests.test_mlx_vision_mrope import logprobs, turn

# Building the model and starting its server takes most of a minute on a busy 2-core machine.
pytestmark = pytest.mark.slow

CELL = PATCH * MERGE
WIDE = image_bytes(size=(4 * CELL, 2 * CELL), color=30)
OTHER = image_bytes(size=(4 * CELL, 2 * CELL), color=200)
TALL = image_bytes(size=(CELL, 3 * CELL), color=90)
# A seed whose greedy answers to WIDE and OTHER run six tokens with no end token among them.
SEED = 3
N_TOKENS = 6


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_hf_qwen2vl_model(tmp_path_factory.mktemp("hf-qwen2vl") / "tiny-qwen2-vl", SEED)


@pytest.fixture(scope="module")
def qwen2vl(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Iterator[ServerProcess]:
    yield from serving(
        tmp_path_factory, "hf-qwen2vl", "-m", str(model_dir), "--backend", "transformers",
        "--alias", "m", "-c", "1024", "-np", "2",
    )  # fmt: skip


def ask(client: openai.OpenAI, *pictures: bytes, **extra: Any) -> Any:
    return client.chat.completions.create(
        model="m", messages=turn(*pictures), max_tokens=N_TOKENS, temperature=0, logprobs=True,
        top_logprobs=3, **extra,
    )  # fmt: skip


def test_served_by_transformers_one_sequence_at_a_time(qwen2vl: ServerProcess) -> None:
    with qwen2vl.http() as http:
        props = http.get("/props").json()
        listed = http.get("/v1/models").json()["data"]
    assert props["batched_decode"] is False
    assert props["modalities"]["vision"] is True
    assert listed[0]["meta"]["backend"] == "transformers"
    assert "image" in listed[0]["input_modalities"]


def test_image_tokens_follow_the_grid(qwen2vl: ServerProcess) -> None:
    client = qwen2vl.openai()
    none = ask(client).usage.prompt_tokens
    for picture, (width, height) in ((WIDE, (4 * CELL, 2 * CELL)), (TALL, (CELL, 3 * CELL))):
        rows, columns = grid(width, height)
        # The merged grid's tokens between the vision start and end tokens.
        assert ask(client, picture).usage.prompt_tokens - none == rows * columns + 2
    assert ask(client, WIDE, TALL).usage.prompt_tokens - none == 2 * 4 + 3 * 1 + 2 * 2


def test_same_image_same_answer_other_image_other(qwen2vl: ServerProcess) -> None:
    client = qwen2vl.openai()
    first = ask(client, WIDE)
    again = ask(client, WIDE)
    # The second time the image's tokens come from the slot's KV state (prefix reuse).
    assert again.usage.prompt_tokens_details.cached_tokens >= 8
    assert logprobs(again) == logprobs(first)
    assert logprobs(ask(client, OTHER))[0] != logprobs(first)[0]


def _generate(model_dir: Path, prompt: str, picture: bytes) -> str:
    """transformers' own greedy generate of the rendered prompt with the image."""
    import torch
    from transformers import AutoImageProcessor, AutoTokenizer, Qwen2VLForConditionalGeneration

    model = Qwen2VLForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    pixels = AutoImageProcessor.from_pretrained(model_dir)(
        images=[Image.open(io.BytesIO(picture)).convert("RGB")], return_tensors="pt"
    )
    n_image = int(pixels["image_grid_thw"].prod()) // MERGE**2
    text = prompt.replace(
        "<__media__>", f"<|vision_start|>{'<|image_pad|>' * n_image}<|vision_end|>"
    )
    inputs = tokenizer(text, return_tensors="pt")
    out = model.generate(**inputs, **pixels, max_new_tokens=N_TOKENS, do_sample=False)
    decoded: str = tokenizer.decode(
        out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True
    )
    return decoded


def test_greedy_answer_is_transformers_generate(qwen2vl: ServerProcess, model_dir: Path) -> None:
    client = qwen2vl.openai()
    for picture in (WIDE, OTHER):
        prompt = applied_prompt(qwen2vl, turn(picture), add_generation_prompt=True)
        answer = ask(client, picture)
        assert answer.usage.completion_tokens == N_TOKENS
        assert answer.choices[0].message.content == _generate(model_dir, prompt, picture)


def test_streaming_matches_the_whole_answer(qwen2vl: ServerProcess) -> None:
    client = qwen2vl.openai()
    whole = ask(client, TALL)
    chunks = list(
        client.chat.completions.create(
            model="m", messages=turn(TALL), max_tokens=N_TOKENS, temperature=0, stream=True,
            stream_options={"include_usage": True},
        )
    )  # fmt: skip
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
