"""Audio (and audio with images) on the MLX engine over HTTP: a tiny random-weight Gemma 4
(tests/mlx_gemma4.py) loaded through mlx-vlm, which hears through a conformer audio tower.

Its processor lays a clip out as begin-audio, one audio token a 40 ms, end-audio; the engine
embeds each clip on its own through the model's get_input_embeddings and runs the rows in
the slots as it does an image's. The reference is mlx-vlm's own generate on the same prompt,
samples and image. Random weights say nothing sensible: the tests assert counts and
log-probabilities, never words.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import openai
import pytest
from PIL import Image

from tests.audio_util import samples_of, written_as
from tests.conftest import applied_prompt, serving
from tests.media_util import data_uri, image_bytes
from tests.mlx_gemma4 import AUDIO_SEQ_LENGTH, MEDIA_TOKENS, MS_PER_TOKEN, build_gemma4_model
from tests.server_process import ServerProcess
from tests.test_audio_input import (
    OTHER_WAV,
    RATE,
    WAV,
    audio_part,
    messages,
    refused,
    streams_as_whole,
    tone,
)
from tests.test_mlx_vision_mrope import alone_and_together

# Building the model and starting its server takes most of a minute on a busy 2-core machine.
pytestmark = pytest.mark.slow

MAX_SECONDS, MAX_BYTES = 40, 4_000_000
STEPS = 4
LONGEST = AUDIO_SEQ_LENGTH * MS_PER_TOKEN / 1000
"""The longest clip the model lays out whole (30 s)."""


LONGER_MP3 = written_as(tone(2, 440), RATE, "mp3")
PNG = image_bytes(size=(32, 16), color=30)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_gemma4_model(tmp_path_factory.mktemp("mlx-gemma4") / "tiny-gemma-4")


@pytest.fixture(scope="module")
def gemma4(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Iterator[ServerProcess]:
    yield from serving(
        tmp_path_factory, "mlx-gemma4", "-m", str(model_dir), "--alias", "m", "-c", "2048",
        "-np", "2", "--max-audio-seconds", str(MAX_SECONDS), "--media-max-bytes", str(MAX_BYTES),
    )  # fmt: skip


def image_part(data: bytes) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": data_uri(data)}}


def ask(client: openai.OpenAI, *parts: dict[str, Any]) -> Any:
    return client.chat.completions.create(
        model="m", messages=messages(*parts), max_tokens=STEPS, temperature=0, logprobs=True,
        top_logprobs=3,
    )  # fmt: skip


def top(answer: Any) -> list[list[tuple[str, float]]]:
    return [
        [(t.token, round(t.logprob, 4)) for t in step.top_logprobs]
        for step in answer.choices[0].logprobs.content
    ]


def test_audio_tokens_count_in_usage(gemma4: ServerProcess) -> None:
    client = gemma4.openai()
    none = ask(client).usage.prompt_tokens
    # One token a 40 ms between the begin-audio and end-audio tokens.
    per_second = 1000 // MS_PER_TOKEN
    assert ask(client, audio_part(WAV)).usage.prompt_tokens == none + per_second + 2
    longer = ask(client, audio_part(LONGER_MP3, "mp3")).usage.prompt_tokens
    assert longer == none + 2 * per_second + 2
    two = ask(client, audio_part(WAV), audio_part(OTHER_WAV)).usage.prompt_tokens
    assert two == none + 2 * (per_second + 2)


def test_same_clip_same_answer_other_clip_other_logprobs(gemma4: ServerProcess) -> None:
    client = gemma4.openai()
    first = top(ask(client, audio_part(WAV)))
    assert top(ask(client, audio_part(WAV))) == first
    assert top(ask(client, audio_part(OTHER_WAV)))[0] != first[0]
    assert top(ask(client))[0] != first[0]


def _generate(model_dir: Path, prompt: str, clips: list[bytes], pictures: list[bytes]) -> Any:
    """mlx-vlm's greedy generate of the prompt: each step's top 3 log-probabilities."""
    from mlx_vlm.generate.dispatch import stream_generate
    from mlx_vlm.utils import load_model, load_processor

    model = load_model(model_dir)
    processor = load_processor(model_dir, add_detokenizer=True)
    paths = []
    for i, picture in enumerate(pictures):
        paths.append(str(model_dir.parent / f"picture-{i}.png"))
        Image.open(io.BytesIO(picture)).save(paths[-1])
    media = iter([MEDIA_TOKENS["audio_token"]] * len(clips) + [MEDIA_TOKENS["image_token"]])
    text = "".join(
        piece if i == 0 else next(media) + piece
        for i, piece in enumerate(prompt.split("<__media__>"))
    )
    generated = stream_generate(
        model, processor, text, image=paths or None, audio=[samples_of(c) for c in clips],
        max_tokens=STEPS, temperature=0.0,
    )  # fmt: skip
    # Its last response, the summary, repeats the last token's.
    steps = [np.array(step.logprobs.astype(mx.float32)) for step in generated][:STEPS]
    return [sorted(step.tolist(), reverse=True)[:3] for step in steps]


@pytest.mark.parametrize(
    ("clips", "pictures"),
    [([WAV], []), ([WAV, OTHER_WAV], []), ([OTHER_WAV], [PNG])],
    ids=["one-clip", "two-clips", "clip-and-image"],
)
def test_greedy_answer_is_mlx_vlms_generate(
    gemma4: ServerProcess, model_dir: Path, clips: list[bytes], pictures: list[bytes]
) -> None:
    # The clips first, then the picture: as _generate lays them out.
    parts = [audio_part(clip) for clip in clips] + [image_part(p) for p in pictures]
    answer = ask(gemma4.openai(), *parts)
    served = [[t.logprob for t in step.top_logprobs] for step in answer.choices[0].logprobs.content]
    prompt = applied_prompt(gemma4, messages(*parts), add_generation_prompt=True)
    expected = _generate(model_dir, prompt, clips, pictures)
    assert len(served) == len(expected) == STEPS
    assert np.allclose(served, expected, atol=1e-3)


def test_streaming_with_a_clip_and_an_image_counts_the_same(gemma4: ServerProcess) -> None:
    client = gemma4.openai()
    parts = (image_part(PNG), audio_part(WAV))
    whole = ask(client, *parts)
    streams_as_whole(client, whole, *parts, steps=STEPS)
    assert whole.usage.prompt_tokens > ask(client, audio_part(WAV)).usage.prompt_tokens


def test_images_of_different_sizes_and_a_clip_together(gemma4: ServerProcess) -> None:
    # Gemma 4's processor gives images of different sizes as a list (its vision tower takes
    # them one by one): each keeps its own token count.
    client = gemma4.openai()
    tall = image_bytes(size=(16, 40), color=90)
    none = ask(client).usage.prompt_tokens
    alone = [
        ask(client, part).usage.prompt_tokens - none for part in (image_part(PNG), image_part(tall))
    ]
    clip = ask(client, audio_part(WAV)).usage.prompt_tokens - none
    together = ask(client, image_part(PNG), audio_part(WAV), image_part(tall))
    assert together.usage.prompt_tokens == none + sum(alone) + clip
    assert alone[0] != alone[1]


def test_alone_and_batched_answers_match(gemma4: ServerProcess) -> None:
    # Two clips decoding together in the slots' batch (sliding and full attention caches).
    def asking(client: openai.OpenAI, clip: bytes) -> Any:
        return ask(client, audio_part(clip))

    alone, together = alone_and_together(gemma4.openai(), WAV, OTHER_WAV, asking=asking)
    assert together == alone


def test_the_model_lists_audio(gemma4: ServerProcess) -> None:
    with gemma4.http() as http:
        (listed,) = http.get("/v1/models").json()["data"]
        props = http.get("/props").json()
    assert listed["input_modalities"] == ["text", "image", "audio"]
    assert props["modalities"] == {"vision": True, "audio": True}


def test_limits(gemma4: ServerProcess) -> None:
    # Longer than the model lays out whole, within the server's limit.
    error = refused(gemma4, audio_part(written_as(tone(LONGEST + 1, 300), RATE, "mp3"), "mp3"))
    assert error["type"] == "invalid_request_error"
    assert f"at most {LONGEST:g} s a clip" in error["message"]
    error = refused(gemma4, audio_part(written_as(tone(MAX_SECONDS + 2, 300), RATE, "mp3"), "mp3"))
    assert (error["code"], error["param"]) == ("audio_too_long", "messages.0.content.1")
    assert "--max-audio-seconds" in error["message"]
    error = refused(gemma4, audio_part(os.urandom(MAX_BYTES + 1000)))
    assert (error["code"], error["param"]) == ("media_too_large", "messages.0.content.1")


def test_what_is_not_audio_is_named(gemma4: ServerProcess) -> None:
    error = refused(gemma4, audio_part(image_bytes()))
    assert (error["code"], error["param"]) == ("invalid_audio", "messages.0.content.1")
    assert "png" in error["message"].lower()
    part = {"type": "input_audio", "input_audio": {"data": "not base64!", "format": "wav"}}
    assert refused(gemma4, part)["message"] == "input_audio.data is not valid base64"
