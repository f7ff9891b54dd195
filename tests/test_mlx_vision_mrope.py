"""Images on an M-RoPE model on the MLX engine over HTTP: a tiny random-weight Qwen2-VL
(tests/mlx_qwen2vl.py) loaded through mlx-vlm.

Qwen2-VL lays an image's tokens on its grid (temporal, row, column positions) and moves the
text after it on by the grid's longer side, so the engine passes the model its position ids
for every prompt chunk and decode step. The reference is mlx-vlm's own forward of the same
prompt, which computes its positions itself (get_rope_index). Random weights say nothing
sensible: the tests assert counts and log-probabilities, never words.
"""

from __future__ import annotations

import io
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import openai
import pytest
from PIL import Image

from tests.conftest import applied_prompt, serving
from tests.media_util import data_uri, image_bytes
from tests.mlx_qwen2vl import MERGE, PATCH, build_qwen2vl_model, grid
from tests.server_process import ServerProcess

# Building the model and starting its server takes most of a minute on a busy 2-core machine.
pytestmark = pytest.mark.slow

CELL = PATCH * MERGE
WIDE = image_bytes(size=(4 * CELL, 2 * CELL), color=30)
OTHER = image_bytes(size=(4 * CELL, 2 * CELL), color=200)
TALL = image_bytes(size=(CELL, 3 * CELL), color=90)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_qwen2vl_model(tmp_path_factory.mktemp("mlx-qwen2vl") / "tiny-qwen2-vl")


@pytest.fixture(scope="module")
def qwen2vl(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Iterator[ServerProcess]:
    # -m alone: a folder with a vision tower is served as a vision model (test_mlx_vision.py
    # serves its model through a config file's `kind: vision`).
    yield from serving(
        tmp_path_factory,
        "mlx-qwen2vl",
        "-m",
        str(model_dir),
        "--alias",
        "m",
        "-c",
        "1024",
        "-np",
        "2",
    )


def turn(*pictures: bytes) -> list[dict[str, Any]]:
    parts = [{"type": "image_url", "image_url": {"url": data_uri(p)}} for p in pictures]
    return [{"role": "user", "content": [{"type": "text", "text": "Describe:"}, *parts]}]


def ask(client: openai.OpenAI, *pictures: bytes, **extra: Any) -> Any:
    return client.chat.completions.create(
        model="m", messages=turn(*pictures), max_tokens=4, temperature=0, logprobs=True,
        top_logprobs=3, **extra,
    )  # fmt: skip


def logprobs(answer: Any) -> list[list[tuple[str, float]]]:
    return [
        [(t.token, round(t.logprob, 4)) for t in step.top_logprobs]
        for step in answer.choices[0].logprobs.content
    ]


def test_image_tokens_follow_the_grid(qwen2vl: ServerProcess) -> None:
    client = qwen2vl.openai()
    none = ask(client).usage.prompt_tokens
    for picture, (width, height) in ((WIDE, (4 * CELL, 2 * CELL)), (TALL, (CELL, 3 * CELL))):
        rows, columns = grid(width, height)
        # The merged grid's tokens between the vision start and end tokens.
        assert ask(client, picture).usage.prompt_tokens - none == rows * columns + 2
    both = ask(client, WIDE, TALL).usage.prompt_tokens
    # Each image between its own start and end tokens.
    assert both - none == 2 * 4 + 3 * 1 + 2 * 2


def test_same_image_same_answer_other_image_other(qwen2vl: ServerProcess) -> None:
    client = qwen2vl.openai()
    first = ask(client, WIDE)
    again = ask(client, WIDE)
    # The second time the image's tokens come from the slot's KV state (prefix reuse).
    assert again.usage.prompt_tokens_details.cached_tokens >= 8
    assert logprobs(again) == logprobs(first)
    assert logprobs(ask(client, OTHER))[0] != logprobs(first)[0]


def _reference(model_dir: Path, prompt: str, picture: bytes, *, flat: bool) -> list[list[float]]:
    """mlx-vlm's own forward of the prompt, then of the prompt and its greedy next token:
    each step's top 3 log-probabilities; `flat`: with positions one a token (what serving
    without M-RoPE positions would compute)."""
    from mlx_vlm.utils import load_model, load_processor

    model = load_model(model_dir)
    processor = load_processor(model_dir, add_detokenizer=False)
    text = prompt.replace("<__media__>", "<|vision_start|><|image_pad|><|vision_end|>")
    inputs = processor(text=text, images=[Image.open(io.BytesIO(picture)).convert("RGB")])
    ids = mx.array(np.asarray(inputs["input_ids"]))
    extra: dict[str, Any] = {
        "pixel_values": mx.array(np.asarray(inputs["pixel_values"])),
        "image_grid_thw": mx.array(np.asarray(inputs["image_grid_thw"])),
    }
    steps = []
    for _ in range(2):
        if flat:
            extra["position_ids"] = mx.broadcast_to(mx.arange(ids.shape[1]), (3, 1, ids.shape[1]))
        logits = model(ids, **extra).logits[0, -1].astype(mx.float32)
        steps.append(sorted(np.array(logits - mx.logsumexp(logits)).tolist(), reverse=True)[:3])
        ids = mx.concatenate([ids, mx.argmax(logits).reshape(1, 1).astype(ids.dtype)], axis=1)
    return steps


def test_positions_are_qwen2vls(qwen2vl: ServerProcess, model_dir: Path) -> None:
    answer = ask(qwen2vl.openai(), WIDE)
    # The prompt's last token and the first decode step: both after the image's jump.
    served = [
        [t.logprob for t in step.top_logprobs] for step in answer.choices[0].logprobs.content[:2]
    ]
    prompt = applied_prompt(qwen2vl, turn(WIDE), add_generation_prompt=True)
    expected = _reference(model_dir, prompt, WIDE, flat=False)
    assert np.allclose(served, expected, atol=1e-3)
    # Positions one a token answer otherwise: the check can tell them apart.
    flat = _reference(model_dir, prompt, WIDE, flat=True)
    assert not np.allclose(flat[0], expected[0], atol=1e-3)


def test_streaming_and_concurrent_requests_match(qwen2vl: ServerProcess) -> None:
    client = qwen2vl.openai()
    whole = ask(client, TALL)
    chunks = list(
        client.chat.completions.create(
            model="m", messages=turn(TALL), max_tokens=4, temperature=0, stream=True,
            stream_options={"include_usage": True},
        )
    )  # fmt: skip
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    # Two sequences whose positions run apart decode as rows of one batch.
    alone, together = alone_and_together(client, WIDE, OTHER)
    assert together == alone


def alone_and_together(
    client: openai.OpenAI, *pictures: bytes, asking: Callable[..., Any] = ask
) -> tuple[Any, Any]:
    """Each picture's (or clip's) answer (`logprobs`) asked alone, then all of them asked at
    once; `asking(client, medium)` asks."""
    alone = {picture: logprobs(asking(client, picture)) for picture in pictures}
    together: dict[bytes, Any] = {}
    threads = [
        threading.Thread(target=lambda p=p: together.update({p: logprobs(asking(client, p))}))
        for p in pictures
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return alone, together
