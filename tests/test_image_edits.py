"""POST /v1/images/edits (multipart) through the openai SDK: image to image, inpainting that
keeps every unmasked pixel, streamed edits, and each upload the model cannot take -> 400."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import openai
import pytest
from PIL import Image

from tests.conftest import IMAGE_KEY
from tests.server_process import ServerProcess
from tests.test_images import decoded

# The image tests share one server, whose start (torch, diffusers, two pipelines) is slow.
pytestmark = pytest.mark.slow


FAST = {"steps": 2}


def png(size: tuple[int, int] = (64, 64), mode: str = "RGB", seed: int = 0) -> bytes:
    """A PNG of random pixels."""
    rng = np.random.default_rng(seed)
    channels = len(mode)
    pixels = rng.integers(0, 256, (size[1], size[0], channels), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels.squeeze(), mode).save(out, format="PNG")
    return out.getvalue()


def bomb() -> bytes:
    """A small PNG whose header promises more pixels than Pillow will decode."""
    out = io.BytesIO()
    Image.new("1", (20000, 20000)).save(out, format="PNG")
    return out.getvalue()


def top_half_mask(size: tuple[int, int] = (64, 64)) -> bytes:
    """Transparent (edit here) over the top half, opaque (keep) below."""
    alpha = np.full((size[1], size[0]), 255, dtype=np.uint8)
    alpha[: size[1] // 2] = 0
    rgba = np.dstack([np.zeros((size[1], size[0], 3), np.uint8), alpha])
    out = io.BytesIO()
    Image.fromarray(rgba, "RGBA").save(out, format="PNG")
    return out.getvalue()


def upload(data: bytes, name: str = "in.png") -> tuple[str, bytes, str]:
    return (name, data, "image/png")


def test_image_to_image(images_client: openai.OpenAI) -> None:
    answer = images_client.images.edit(
        image=upload(png()), prompt="a dog", n=2, extra_body={**FAST, "seed": 4}
    )
    assert answer.data is not None and len(answer.data) == 2
    images = [decoded(item.b64_json) for item in answer.data]
    assert [(i.format, i.size) for i in images] == [("PNG", (64, 64))] * 2
    assert images[0].tobytes() != images[1].tobytes()
    again = images_client.images.edit(
        image=upload(png()), prompt="a dog", n=2, extra_body={**FAST, "seed": 4}
    )
    assert again.data is not None and again.data[0].b64_json == answer.data[0].b64_json


def test_strength_and_auto_size(images_client: openai.OpenAI) -> None:
    def edited(**body: Any) -> str | None:
        extra = {"steps": 4, "seed": 2, **body}
        answer = images_client.images.edit(
            image=upload(png((70, 70))), prompt="a dog", extra_body=extra
        )
        assert answer.data is not None and answer.size == "64x64"
        return answer.data[0].b64_json

    assert edited(strength=0.5) != edited(strength=1.0)


def test_inpainting_keeps_the_unmasked_pixels(images_client: openai.OpenAI) -> None:
    source = png(seed=5)
    answer = images_client.images.edit(
        image=upload(source),
        mask=upload(top_half_mask(), "mask.png"),
        prompt="a sun",
        extra_body=FAST,
    )
    assert answer.data is not None
    out = np.asarray(decoded(answer.data[0].b64_json))
    original = np.asarray(Image.open(io.BytesIO(source)))
    assert np.array_equal(out[32:], original[32:])
    assert not np.array_equal(out[:32], original[:32])


def test_streamed_edit(images_client: openai.OpenAI) -> None:
    stream = images_client.images.edit(
        image=[upload(png())],
        prompt="a cat",
        stream=True,
        partial_images=1,
        extra_body={"steps": 4, "strength": 1.0},
    )
    types = [event.type for event in stream]
    assert types.count("image_edit.progress") == 4
    assert types.count("image_edit.partial_image") == 1
    assert types[-1] == "image_edit.completed"


@pytest.mark.parametrize(
    ("files", "param", "words"),
    [
        ([("image", upload(b"not an image", "a.txt"))], "image", "not a PNG"),
        ([("image", upload(png())), ("mask", upload(png((32, 32), "RGBA")))], "mask", "same size"),
        ([("image", upload(png())), ("mask", upload(png()))], "mask", "alpha"),
        ([("image[]", upload(png())), ("image[]", upload(png(seed=1)))], "image", "1 image"),
        ([("image[]", upload(png((8, 8))))] * 17, "image", "at most 16"),
        ([("image", upload(png((2056, 8))))], "image", "up to 2048"),
        ([("markup", upload(png()))], "markup", "unsupported"),
        ([], "image", "needs an 'image'"),
    ],
)
def test_bad_uploads(
    images_server: ServerProcess, files: list[tuple[str, Any]], param: str, words: str
) -> None:
    with images_server.http(headers={"Authorization": f"Bearer {IMAGE_KEY}"}) as http:
        # Fields as parts without a file name, so a body without files is multipart too.
        fields: list[tuple[str, Any]] = [("prompt", (None, "a cat")), ("steps", (None, "2"))]
        response = http.post("/v1/images/edits", files=fields + files)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and words in error["message"]


def test_an_image_bomb_is_refused_before_it_is_decoded(images_server: ServerProcess) -> None:
    with images_server.http(headers={"Authorization": f"Bearer {IMAGE_KEY}"}) as http:
        response = http.post(
            "/v1/images/edits", data={"prompt": "a cat"}, files=[("image", upload(bomb()))]
        )
    assert response.status_code == 400, response.text
    assert "too many pixels" in response.json()["error"]["message"]


def test_bad_edit_bodies(images_server: ServerProcess) -> None:
    with images_server.http(headers={"Authorization": f"Bearer {IMAGE_KEY}"}) as http:
        as_json = http.post("/v1/images/edits", json={"prompt": "a cat"})
        bad_field = http.post(
            "/v1/images/edits",
            data={"prompt": "a cat", "strength": "2"},
            files=[("image", upload(png()))],
        )
        refused = http.post(
            "/v1/images/edits",
            data={"prompt": "a cat", "input_fidelity": "high"},
            files=[("image", upload(png()))],
        )
    assert as_json.status_code == 400 and "multipart" in as_json.json()["error"]["message"]
    assert bad_field.status_code == 400 and bad_field.json()["error"]["param"] == "strength"
    assert refused.status_code == 400
    assert refused.json()["error"]["code"] == "unsupported_field"
