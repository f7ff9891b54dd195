"""llama-server's media marker, `<__media__>`: in its /completion, a prompt object's markers
stand for the base64 files of its `multimodal_data`; in a chat message it is text like any
other. On a tiny random-weight GGUF with a LLaVA-style projector (libmtmd). Random weights say
nothing sensible: the tests assert the path (image tokens evaluated, the same image the same
probabilities, another image others) and every refusal."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from bench.models import SHAPES, tiny
from bench.vision_models import VisionShape
from bench.vision_models import build as build_projector

from mlxcel.media.images import LLAMA_MEDIA_MARKER as MARKER
from mlxcel.media.images import MEDIA_MARKER
from tests.conftest import serving
from tests.media_util import MIME, image_bytes
from tests.server_process import ServerProcess

PROJECTOR = VisionShape(tiny(SHAPES["smollm2-135m"]).hidden)
PNG = image_bytes()


@pytest.fixture(scope="module")
def vision(tmp_path_factory: pytest.TempPathFactory, tiny_gguf: Path) -> Iterator[ServerProcess]:
    mmproj = build_projector(PROJECTOR, tmp_path_factory.mktemp("native-vision-model"))
    yield from serving(
        tmp_path_factory, "native-vision", "-m", str(tiny_gguf), "--mmproj", str(mmproj),
        "--ctx-size", "1024",
    )  # fmt: skip


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def complete(http: httpx.Client, prompt: Any, **extra: Any) -> httpx.Response:
    body = {"prompt": prompt, "n_predict": 2, "temperature": 0, "n_probs": 3, **extra}
    return http.post("/completion", json=body)


def answer(http: httpx.Client, text: str, *images: bytes) -> dict[str, Any]:
    prompt = {"prompt_string": text, "multimodal_data": [b64(i) for i in images]}
    response = complete(http, prompt)
    assert response.status_code == 200, response.text
    found: dict[str, Any] = response.json()
    return found


def error(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 400, response.text
    found: dict[str, Any] = response.json()["error"]
    return found


def test_images_are_evaluated_in_place_of_their_markers(vision: ServerProcess) -> None:
    with vision.http() as http:
        text = answer(http, "Look: now")
        one = answer(http, f"Look: {MARKER} now", PNG)
        two = answer(http, f"A: {MARKER} B: {MARKER}", PNG, image_bytes(color=80))
    assert one["prompt"] == f"Look: {MARKER} now"
    # An image is (image size / patch size)^2 tokens, give or take its marker.
    assert one["tokens_evaluated"] - text["tokens_evaluated"] >= PROJECTOR.image_tokens - 2
    assert two["tokens_evaluated"] - text["tokens_evaluated"] >= 2 * PROJECTOR.image_tokens - 4
    assert one["tokens_predicted"] == 2


def test_the_same_image_gives_the_same_probabilities_another_image_others(
    vision: ServerProcess,
) -> None:
    prompt = f"Look: {MARKER}"
    with vision.http() as http:
        first = answer(http, prompt, PNG)["completion_probabilities"][0]
        again = answer(http, prompt, PNG)["completion_probabilities"][0]
        other = answer(http, prompt, image_bytes(color=200))["completion_probabilities"][0]
    assert again == first
    assert other["top_logprobs"] != first["top_logprobs"]


@pytest.mark.parametrize("fmt", list(MIME))
def test_each_format_is_told_by_its_bytes(vision: ServerProcess, fmt: str) -> None:
    with vision.http() as http:
        found = answer(http, f"Look: {MARKER}", image_bytes(fmt))
    assert found["tokens_predicted"] == 2


def test_streamed_the_final_object_counts_the_same(vision: ServerProcess) -> None:
    prompt = {"prompt_string": f"Look: {MARKER}", "multimodal_data": [b64(PNG)]}
    with vision.http() as http:
        whole = complete(http, prompt).json()
        streamed = complete(http, prompt, stream=True)
    assert streamed.status_code == 200
    events = [json.loads(line[6:]) for line in streamed.text.splitlines() if line[:6] == "data: "]
    assert events[-1]["stop"] is True
    assert events[-1]["tokens_evaluated"] == whole["tokens_evaluated"]


def test_what_is_wrong_with_a_media_prompt_is_a_400_naming_it(vision: ServerProcess) -> None:
    with vision.http() as http:
        # A marker short: libmtmd refuses the layout, and the prompt is named.
        found = error(complete(http, {"prompt_string": "Look:", "multimodal_data": [b64(PNG)]}))
        assert found["param"] == "prompt"
        assert "media markers" in found["message"]
        two = {"prompt_string": MARKER * 2, "multimodal_data": [b64(PNG)]}
        assert error(complete(http, two))["param"] == "prompt"
        found = error(complete(http, {"prompt_string": MARKER, "multimodal_data": ["%%"]}))
        assert (found["param"], found["code"]) == ("prompt.multimodal_data.0", "invalid_image")
        text_file = b64(b"plain text, not a picture")
        found = error(complete(http, {"prompt_string": MARKER, "multimodal_data": [text_file]}))
        assert found["param"] == "prompt.multimodal_data.0"
        assert "not a PNG, JPEG, WebP or GIF image" in found["message"]
        # A PNG's signature on a file that does not decode.
        broken = b64(PNG[:40])
        found = error(complete(http, {"prompt_string": MARKER, "multimodal_data": [broken]}))
        assert (found["param"], found["code"]) == ("prompt.multimodal_data.0", "invalid_image")
        bogus = {"prompt_string": MARKER, "multimodal_data": [], "images": []}
        found = error(complete(http, bogus))
        assert (found["param"], found["code"]) == ("prompt.images", "unsupported_field")
        # The server serves on.
        assert answer(http, f"Look: {MARKER}", PNG)["tokens_predicted"] == 2


def test_a_text_model_refuses_the_media(server: ServerProcess) -> None:
    with server.http() as http:
        found = error(complete(http, {"prompt_string": MARKER, "multimodal_data": [b64(PNG)]}))
        assert found["message"] == "model does not support image input"
        assert found["param"] == "prompt.multimodal_data.0"
        # Without media the prompt object is a text prompt.
        response = complete(http, {"prompt_string": "Hello"})
        assert response.status_code == 200, response.text
        assert response.json()["prompt"] == "Hello"


def image_part() -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{b64(PNG)}"}}


def test_a_chat_message_may_quote_the_marker_beside_an_image(vision: ServerProcess) -> None:
    """The marker in a message's text is that text, not a place for the message's image."""

    def prompt_tokens(http: httpx.Client, text: str) -> int:
        content = [{"type": "text", "text": text}, image_part()]
        body = {"messages": [{"role": "user", "content": content}], "max_tokens": 1}
        response = http.post("/v1/chat/completions", json=body)
        assert response.status_code == 200, response.text
        count: int = response.json()["usage"]["prompt_tokens"]
        return count

    with vision.http() as http:
        assert prompt_tokens(http, f"What does {MARKER} mean?") > prompt_tokens(
            http, "What does this mean?"
        )
        content = [{"type": "text", "text": f"Say {MARKER}"}, image_part()]
        messages = [{"role": "user", "content": content}]
        applied = http.post("/apply-template", json={"messages": messages}).json()["prompt"]
    # /apply-template writes the image's place as llama-server does: the quote and the image.
    assert applied.count(MARKER) == 2


def test_a_message_holding_the_engines_marker_beside_an_image_is_a_400(
    vision: ServerProcess,
) -> None:
    """The marker the engines are given would take an image's place: it is refused, named."""
    content = [{"type": "text", "text": f"Say {MEDIA_MARKER}"}, image_part()]
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": 1}
    with vision.http() as http:
        found = error(http.post("/v1/chat/completions", json=body))
        assert found["param"] == "messages"
        assert MEDIA_MARKER in found["message"]
        # Without an image it is only text.
        body["messages"] = [{"role": "user", "content": f"Say {MEDIA_MARKER}"}]
        assert http.post("/v1/chat/completions", json=body).status_code == 200
