"""Images on the MLX engine over HTTP: a tiny random-weight LLaVA loaded through mlx-vlm.

The model's processor lays out the image tokens and its vision tower embeds them; random
weights say nothing sensible, so the tests assert the path, as tests/test_vision.py does.
The server runs on the media policy's defaults, so it also shows that they refuse remote and
local media (tests/test_vision.py's server allows both). One server: it is this file's cost.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import serving
from tests.media_util import data_uri, http_server, image_bytes
from tests.mlx_model import IMAGE_TOKENS, build_vision_model
from tests.server_process import ServerProcess
from tests.test_vision import ask, refusal, top

# Building the model and starting its server takes most of a minute on a busy 2-core machine.
pytestmark = pytest.mark.slow

PNG = image_bytes(size=(40, 30), color=30)


@pytest.fixture(scope="module")
def mlx_vision(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("mlx-vlm")
    model = build_vision_model(root / "tiny-llava")
    config = root / "models.yaml"
    config.write_text(f"models:\n  - model_path: {model}\n    kind: vision\n    name: m\n")
    yield from serving(tmp_path_factory, "mlx-vision", "--config", str(config), "-c", "1024")


def test_image_tokens_count_in_usage(mlx_vision: ServerProcess) -> None:
    client = mlx_vision.openai()
    none = ask(client).usage.prompt_tokens
    one = ask(client, data_uri(PNG)).usage.prompt_tokens
    two = ask(client, data_uri(PNG), data_uri(image_bytes(color=200))).usage.prompt_tokens
    # The marker becomes the model's image token, which the processor repeats per patch.
    assert one - none >= IMAGE_TOKENS - 2
    assert two - one >= IMAGE_TOKENS - 2


def test_same_image_same_answer_other_image_other_logprobs(mlx_vision: ServerProcess) -> None:
    client = mlx_vision.openai()
    first = top(ask(client, data_uri(PNG)))
    again = ask(client, data_uri(PNG))
    # The second time the image's rows come from the cache and its tokens from the prefix cache.
    assert top(again) == first
    assert again.usage.prompt_tokens_details.cached_tokens >= IMAGE_TOKENS
    assert top(ask(client, data_uri(image_bytes(size=(40, 30), color=220)))) != first


def test_streaming_and_responses_with_an_image(mlx_vision: ServerProcess) -> None:
    client = mlx_vision.openai()
    whole = ask(client, data_uri(PNG))
    content: list[Any] = [
        {"type": "text", "text": "Describe:"},
        {"type": "image_url", "image_url": {"url": data_uri(PNG)}},
    ]
    chunks = list(
        client.chat.completions.create(
            model="m", max_tokens=3, temperature=0, stream=True,
            stream_options={"include_usage": True},
            messages=[{"role": "user", "content": content}],
        )
    )  # fmt: skip
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content

    def responses(*parts: dict[str, Any]) -> int:
        content = [{"type": "input_text", "text": "Describe:"}, *parts]
        answer = client.responses.create(
            model="m",
            input=[{"role": "user", "content": content}],  # type: ignore[list-item]
            max_output_tokens=2,
        )
        assert answer.usage is not None
        return answer.usage.input_tokens

    image = {"type": "input_image", "image_url": data_uri(PNG), "detail": "auto"}
    assert responses(image) >= responses() + IMAGE_TOKENS - 2


def test_modalities_are_listed(mlx_vision: ServerProcess) -> None:
    with mlx_vision.http() as http:
        (listed,) = http.get("/v1/models").json()["data"]
    assert listed["input_modalities"] == ["text", "image"]
    # A model that sees but does not hear: an audio part is refused before anything loads.
    part = {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}
    error = refusal_of(mlx_vision, part)
    assert (error["message"], error["code"]) == (
        "model does not support audio input",
        "unsupported_modality",
    )
    assert error["param"] == "messages.0.content.0"


def refusal_of(server: ServerProcess, part: dict[str, Any]) -> dict[str, Any]:
    """The 400's error object for a chat request of one part."""
    with server.http() as http:
        response = http.post(
            "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": [part]}], "max_tokens": 1},
        )
    assert response.status_code == 400, response.text
    error: dict[str, Any] = response.json()["error"]
    return error


def test_remote_and_local_media_are_off_by_default(
    mlx_vision: ServerProcess, tmp_path_factory: pytest.TempPathFactory
) -> None:
    picture = tmp_path_factory.mktemp("local-media") / "in.png"
    picture.write_bytes(PNG)
    with http_server({"/a.png": (200, {}, PNG, 0.0)}) as (base, seen):
        body = refusal(mlx_vision.openai(), f"{base}/a.png")
    assert "--allow-remote-media" in body["error"]["message"]
    assert seen == []
    body = refusal(mlx_vision.openai(), f"file://{picture}")
    assert "--allowed-local-media DIR" in body["error"]["message"]


def test_echo_with_logprobs_is_refused_where_prompts_are_not_scored(
    mlx_vision: ServerProcess,
) -> None:
    # mlx-vlm's forward takes more than token ids: its engine does not score prompts.
    body = {"model": "m", "prompt": "Hello", "echo": True, "logprobs": 1}
    with mlx_vision.http() as http:
        refused = http.post("/v1/completions", json=body)
        plain = http.post("/v1/completions", json={**body, "logprobs": None, "max_tokens": 2})
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["param"] == "echo" and "log-probabilities of the prompt" in error["message"]
    assert plain.status_code == 200 and plain.json()["choices"][0]["text"].startswith("Hello")
