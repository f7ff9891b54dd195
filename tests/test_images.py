"""POST /v1/images/generations through the openai SDK on a tiny random-weight pipeline: sizes,
counts, formats, seeds, url answers and their files, streamed previews and progress, and every
bad request with its status."""

from __future__ import annotations

import base64
import io
import time
from typing import Any

import httpx
import openai
import pytest
from PIL import Image

from tests.conftest import IMAGE_KEY as KEY
from tests.conftest import IMAGE_URL_TTL_S as URL_TTL_S
from tests.conftest import SINGLE_FILE_IMAGE_MODEL as SINGLE_FILE_MODEL
from tests.openapi_check import check_operations
from tests.server_process import ServerProcess

# The image tests share one server, whose start (torch, diffusers, two pipelines) is slow.
pytestmark = pytest.mark.slow


MODEL = "tiny-sd"
FAST = {"steps": 2}


def decoded(b64: str | None) -> Image.Image:
    """An answer's image, opened."""
    assert b64 is not None
    return Image.open(io.BytesIO(base64.b64decode(b64)))


def generate(client: openai.OpenAI, **kwargs: Any) -> list[Image.Image]:
    body = {**FAST, **kwargs.pop("extra_body", {})}
    answer = client.images.generate(prompt="a red cat", extra_body=body, **kwargs)
    assert answer.data is not None
    return [decoded(item.b64_json) for item in answer.data]


def test_png_of_the_default_size(images_client: openai.OpenAI) -> None:
    answer = images_client.images.generate(prompt="a red cat", model=MODEL, extra_body=FAST)
    assert answer.data is not None and len(answer.data) == 1
    image = decoded(answer.data[0].b64_json)
    assert (image.format, image.size, image.mode) == ("PNG", (64, 64), "RGB")
    assert (answer.size, answer.output_format, answer.quality) == ("64x64", "png", "medium")
    assert answer.usage is not None and answer.usage.input_tokens > 0


def test_size_n_and_formats(images_client: openai.OpenAI) -> None:
    images = generate(
        images_client, n=2, size="128x64", output_format="jpeg", output_compression=50
    )
    assert [(i.format, i.size) for i in images] == [("JPEG", (128, 64))] * 2
    assert images[0].tobytes() != images[1].tobytes()
    (webp,) = generate(images_client, size="auto", output_format="webp")
    assert (webp.format, webp.size) == ("WEBP", (64, 64))


def test_same_seed_same_bytes_other_seed_other_image(images_client: openai.OpenAI) -> None:
    def b64(seed: int) -> str | None:
        body = {**FAST, "seed": seed}
        data = images_client.images.generate(prompt="a dog", extra_body=body).data
        assert data is not None
        return data[0].b64_json

    assert b64(7) == b64(7)
    assert b64(7) != b64(8)


def test_a_single_file_checkpoint_draws_what_its_folder_draws(images_client: openai.OpenAI) -> None:
    def b64(model: str) -> str | None:
        body = {**FAST, "seed": 5}
        data = images_client.images.generate(prompt="a dog", model=model, extra_body=body).data
        assert data is not None
        return data[0].b64_json

    assert b64(SINGLE_FILE_MODEL) == b64(MODEL)


def test_extensions_change_the_image(images_server: ServerProcess) -> None:
    base = {"prompt": "a blue house", "seed": 1, "num_inference_steps": 2}
    with images_server.http(headers={"Authorization": f"Bearer {KEY}"}) as http:

        def image(**extra: Any) -> str:
            response = http.post("/v1/images/generations", json={**base, **extra})
            assert response.status_code == 200, response.text
            b64: str = response.json()["data"][0]["b64_json"]
            return b64

        plain = image()
        assert image() == plain
        assert image(negative_prompt="a tree") != plain
        assert image(guidance_scale=1.5) != plain
        assert image(num_inference_steps=3) != plain


def test_url_answer_needs_the_key_and_expires(
    images_client: openai.OpenAI, images_server: ServerProcess
) -> None:
    answer = images_client.images.generate(prompt="a cat", response_format="url", extra_body=FAST)
    assert answer.data is not None
    url = answer.data[0].url
    assert url is not None and url.startswith(images_server.root + "/v1/images/files/")
    assert httpx.get(url).status_code == 401
    fetched = httpx.get(url, headers={"Authorization": f"Bearer {KEY}"})
    assert fetched.status_code == 200 and fetched.headers["content-type"] == "image/png"
    assert Image.open(io.BytesIO(fetched.content)).size == (64, 64)
    time.sleep(URL_TTL_S + 0.5)
    gone = httpx.get(url, headers={"Authorization": f"Bearer {KEY}"})
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "image_not_found"


def test_stream_sends_progress_previews_then_the_image(images_client: openai.OpenAI) -> None:
    stream = images_client.images.generate(
        prompt="a cat", stream=True, partial_images=2, extra_body={"steps": 4, "seed": 3}
    )
    events = list(stream)
    types = [event.type for event in events]
    assert types.count("image_generation.progress") == 4
    partials = [e for e in events if e.type == "image_generation.partial_image"]
    assert [e.partial_image_index for e in partials] == [0, 1]
    assert types[-1] == "image_generation.completed"
    assert types.index("image_generation.partial_image") < types.index("image_generation.completed")
    steps = [e.model_dump()["step"] for e in events if e.type == "image_generation.progress"]
    assert steps == [1, 2, 3, 4]
    final = events[-1]
    assert final.type == "image_generation.completed"
    assert decoded(final.b64_json).size == (64, 64)
    assert all(decoded(e.b64_json).size == (64, 64) for e in partials)
    whole = images_client.images.generate(prompt="a cat", extra_body={"steps": 4, "seed": 3})
    assert whole.data is not None and whole.data[0].b64_json == final.b64_json


def test_quality_sets_the_steps(images_client: openai.OpenAI) -> None:
    stream = images_client.images.generate(prompt="a cat", quality="low", stream=True)
    progress = [e.model_dump() for e in stream if e.type == "image_generation.progress"]
    # The pipeline's own default is 50 steps; low is half of it.
    assert progress[-1]["total_steps"] == 25 and len(progress) == 25


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"size": "65x64"}, 400, "size"),
        ({"size": "big"}, 400, "size"),
        ({"size": "4096x4096"}, 400, "size"),
        # Past --image-max-pixels (1536x1024) though the pipeline draws up to 2048 a side.
        ({"size": "2048x2048"}, 400, "size"),
        ({"size": "1536x1536"}, 400, "size"),
        # Past what one request may cost (--image-max-steps 50 at --image-max-pixels): the
        # work, images x steps x pixels, is bounded, not each factor alone (issue 40: 1024x1024
        # at one step took 150 s on a real model here, and 2 x 1536x1024 at 50 steps was taken).
        ({"size": "1536x1024", "steps": 51}, 400, "num_inference_steps"),
        ({"size": "1024x1024", "n": 2, "steps": 40}, 400, "n"),
        ({"n": 9}, 400, "n"),
        ({"background": "transparent"}, 400, "background"),
        ({"output_format": "gif"}, 400, "output_format"),
        ({"output_compression": 101}, 400, "output_compression"),
        ({"partial_images": 4}, 400, "partial_images"),
        ({"steps": 0}, 400, "steps"),
        ({"style": "vivid"}, 400, "style"),
        ({"colour": "red"}, 400, "colour"),
        ({"prompt": ""}, 400, "prompt"),
        ({"model": "SmolLM2-135M-Instruct.Q4_1"}, 400, "model"),
    ],
)
def test_bad_requests(
    images_server: ServerProcess, body: dict[str, Any], status: int, param: str
) -> None:
    with images_server.http(headers={"Authorization": f"Bearer {KEY}"}) as http:
        response = http.post("/v1/images/generations", json={"prompt": "a cat", **body})
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["message"]


def test_a_chat_cannot_name_the_image_model(images_client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        images_client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}]
        )
    assert "cannot do text" in caught.value.message


def test_the_image_routes_answer_as_documented(images_server: ServerProcess) -> None:
    """schemathesis over the image operations of /openapi.json, on a server that has the
    models: every answer, 200s included, is in a status, type and schema the document gives."""
    auth = {"Authorization": f"Bearer {KEY}"}
    # Two denoising steps unless a case says how many (then at most two).
    steps = {"num_inference_steps": 2}
    assert check_operations(images_server.root, auth, 4, "/v1/images", steps) == 3
    with images_server.http(headers=auth) as http:
        document = http.get("/openapi.json").json()
    edit = document["paths"]["/v1/images/edits"]["post"]
    assert list(edit["requestBody"]["content"]) == ["multipart/form-data"]
    assert {"image", "mask", "prompt"} <= set(
        document["components"]["schemas"]["ImageEditRequest"]["properties"]
    )
    files = document["paths"]["/v1/images/files/{file_id}"]["get"]
    assert "image/png" in files["responses"]["200"]["content"]
