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

import mlx.core as mx
import numpy as np
import pytest
from PIL import Image

from tests.conftest import applied_prompt, serving
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
