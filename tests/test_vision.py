"""Images in chat over HTTP: a tiny random-weight GGUF with a LLaVA-style projector (libmtmd).

Random weights say nothing sensible, so the tests assert the path: image tokens in usage,
determinism, different images giving different log-probabilities, and every refusal.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import numpy as np
import openai
import pytest
from bench.models import SHAPES, tiny
from bench.vision_models import VisionShape, build_idefics3
from bench.vision_models import build as build_projector

from mlxcel.backends.llamacpp.generator import LlamaCppGenerator, LlamaCppOptions
from mlxcel.engine.media import rows_key
from mlxcel.media.images import MEDIA_MARKER, decode
from tests.conftest import serving
from tests.media_util import MIME, bomb_png, data_uri, http_server, image_bytes
from tests.server_process import ServerProcess

TEXT = tiny(SHAPES["smollm2-135m"])
PROJECTOR = VisionShape(TEXT.hidden)
PNG = image_bytes()
# Limits small enough to reach with small images.
MAX_IMAGES, MAX_IMAGE_BYTES, MAX_BYTES, MAX_PIXELS = 3, 200_000, 400_000, 1_000_000


def noise_png(side: int) -> bytes:
    """A PNG of random pixels: it barely compresses, so its size is about 3 * side**2."""
    from PIL import Image

    out = __import__("io").BytesIO()
    Image.frombytes("RGB", (side, side), os.urandom(side * side * 3)).save(out, format="PNG")
    return out.getvalue()


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory, tiny_gguf: Path) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("vision-model")
    allowed = root / "allowed"
    allowed.mkdir()
    (allowed / "in.png").write_bytes(PNG)
    (root / "out.png").write_bytes(PNG)
    (allowed / "link.png").symlink_to(root / "out.png")
    return {
        "text": tiny_gguf,
        "mmproj": build_projector(PROJECTOR, root),
        "allowed": allowed,
        "root": root,
    }


@pytest.fixture(scope="module")
def vision(
    tmp_path_factory: pytest.TempPathFactory, files: dict[str, Path]
) -> Iterator[ServerProcess]:
    yield from serving(
        tmp_path_factory, "vision",
        "-m", str(files["text"]), "--mmproj", str(files["mmproj"]), "--ctx-size", "1024",
        "--allow-remote-media", "--allow-insecure-media", "--media-allow-hosts", "127.0.0.1",
        "--allowed-local-media", str(files["allowed"]), "--media-fetch-timeout", "1",
        "--media-max-images", str(MAX_IMAGES), "--media-max-image-bytes", str(MAX_IMAGE_BYTES),
        "--media-max-bytes", str(MAX_BYTES), "--media-max-pixels", str(MAX_PIXELS),
    )  # fmt: skip


def image_part(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


def ask(client: openai.OpenAI, *urls: str, **extra: Any) -> Any:
    content = [{"type": "text", "text": "Describe:"}, *map(image_part, urls)]
    return client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": content}], max_tokens=3, temperature=0,
        logprobs=True, top_logprobs=3, **extra,
    )  # fmt: skip


def refusal(client: openai.OpenAI, *urls: str) -> dict[str, Any]:
    with pytest.raises(openai.BadRequestError) as caught:
        ask(client, *urls)
    assert caught.value.status_code == 400
    # The SDK keeps the envelope's inner object.
    return {"error": caught.value.body}


def top(answer: Any) -> list[tuple[str, float]]:
    return [
        (t.token, round(t.logprob, 5)) for t in answer.choices[0].logprobs.content[0].top_logprobs
    ]


def test_image_tokens_count_in_usage(vision: ServerProcess) -> None:
    client = vision.openai()
    none = ask(client).usage.prompt_tokens
    one = ask(client, data_uri(PNG)).usage.prompt_tokens
    two = ask(client, data_uri(PNG), data_uri(image_bytes(color=80))).usage.prompt_tokens
    # An image is (image size / patch size)^2 tokens in the prompt, give or take its marker.
    assert one - none >= PROJECTOR.image_tokens - 2
    assert two - one >= PROJECTOR.image_tokens - 2


def test_same_image_same_answer_other_image_other_logprobs(vision: ServerProcess) -> None:
    client = vision.openai()
    first = top(ask(client, data_uri(PNG)))
    assert top(ask(client, data_uri(PNG))) == first
    assert top(ask(client, data_uri(image_bytes(color=200)))) != first


@pytest.mark.parametrize("fmt", list(MIME))
def test_every_format(vision: ServerProcess, fmt: str) -> None:
    answer = ask(vision.openai(), data_uri(image_bytes(fmt), MIME[fmt]))
    assert answer.choices[0].finish_reason in ("stop", "length")


def test_streaming_with_an_image_counts_the_same(vision: ServerProcess) -> None:
    client = vision.openai()
    whole = ask(client, data_uri(PNG))
    chunks = list(
        client.chat.completions.create(
            model="m", max_tokens=3, temperature=0, stream=True,
            stream_options={"include_usage": True},
            messages=[{"role": "user", "content": [{"type": "text", "text": "Describe:"},
                                                   image_part(data_uri(PNG))]}],
        )
    )  # fmt: skip
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content


def test_an_image_with_tools(vision: ServerProcess) -> None:
    tool = {"type": "function", "function": {"name": "look", "parameters": {"type": "object"}}}
    answer = ask(vision.openai(), data_uri(PNG), tools=[tool])
    assert answer.usage.prompt_tokens > PROJECTOR.image_tokens


def test_limits(vision: ServerProcess) -> None:
    client = vision.openai()
    body = refusal(client, *[data_uri(PNG)] * (MAX_IMAGES + 1))
    assert body["error"]["message"] == (
        f"the request has {MAX_IMAGES + 1} images, more than the limit of {MAX_IMAGES} "
        "(--media-max-images)"
    )
    assert body["error"]["code"] == "too_many_images"
    body = refusal(client, data_uri(noise_png(300)))
    assert body["error"]["code"] == "image_too_large"
    assert body["error"]["param"] == "messages.0.content.1.image_url.url"
    assert refusal(client, *[data_uri(noise_png(220))] * 3)["error"]["code"] == "media_too_large"
    body = refusal(client, data_uri(bomb_png(2000)))
    assert body["error"]["message"] == (
        f"image is 2000x2000 = 4000000 pixels, more than the limit of {MAX_PIXELS} "
        "(--media-max-pixels)"
    )


def test_an_image_whose_pixels_do_not_decode_is_a_400_naming_it(vision: ServerProcess) -> None:
    """Its header reads (the HTTP process checks only that), its pixels do not: the model's
    worker, which decodes them, refuses it with the same 400, whole or streamed."""
    broken = data_uri(noise_png(64)[:1500])
    client = vision.openai()
    body = refusal(client, data_uri(PNG), broken)
    assert (body["error"]["code"], body["error"]["param"]) == (
        "invalid_image",
        "messages.0.content.2.image_url.url",
    )
    assert body["error"]["message"] == "could not decode the image: send PNG, JPEG, WebP or GIF"
    content = [{"type": "text", "text": "Describe:"}, image_part(broken)]
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model="m", max_tokens=3, stream=True, messages=[{"role": "user", "content": content}]
        )
    assert caught.value.body["code"] == "invalid_image"  # type: ignore[index]
    source = {"type": "base64", "media_type": "image/png", "data": broken.split(",", 1)[1]}
    with pytest.raises(anthropic.BadRequestError) as counted:
        vision.anthropic().messages.count_tokens(
            model="m",
            messages=[{"role": "user", "content": [{"type": "image", "source": source}]}],  # type: ignore[list-item, typeddict-item]
        )
    assert counted.value.status_code == 400
    assert "could not decode the image" in str(counted.value)
    assert ask(client, data_uri(PNG)).choices[0].finish_reason in ("stop", "length")


def test_images_beyond_the_context_are_a_400(vision: ServerProcess) -> None:
    """A text that fits the context with images that do not: its length is known only once
    the model's worker has laid it out, and it is a 400 all the same (streamed or not, on
    chat and Responses), after which the server serves on."""
    client = vision.openai()
    text = " hello" * 990
    fits = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": text}], max_tokens=1
    )
    assert 1024 - 3 * PROJECTOR.image_tokens <= fits.usage.prompt_tokens < 1024
    content = [{"type": "text", "text": text}, *[image_part(data_uri(PNG))] * 3]
    messages = [{"role": "user", "content": content}]
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(model="m", messages=messages, stream=stream)  # type: ignore[call-overload]
        error = caught.value.body
        assert isinstance(error, dict)
        assert (error["code"], error["param"]) == ("context_length_exceeded", "messages")
        assert error["message"].startswith("the prompt has ")
    parts = [{"type": "input_text", "text": text}]
    parts += [{"type": "input_image", "image_url": data_uri(PNG)}] * 3
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model="m", input=[{"role": "user", "content": parts}])  # type: ignore[typeddict-item]
    assert isinstance(caught.value.body, dict)
    assert caught.value.body["param"] == "input"
    assert ask(client, data_uri(PNG)).choices[0].finish_reason in ("stop", "length")


def test_remote_media_policy(vision: ServerProcess) -> None:
    routes = {
        "/a.png": (200, {}, PNG, 0.0),
        "/away": (302, {"Location": "http://127.0.0.2:9/a.png"}, b"", 0.0),
        "/slow.png": (200, {}, PNG, 3.0),
    }
    with http_server(routes) as (base, seen):
        assert ask(vision.openai(), f"{base}/a.png").usage.prompt_tokens > 0
        body = refusal(vision.openai(), f"{base}/away")
        assert body["error"]["message"] == (
            "media URL host '127.0.0.2' resolves to 127.0.0.2, a loopback address; "
            "list the host in --media-allow-hosts to fetch from it"
        )
        body = refusal(vision.openai(), f"{base}/slow.png")
        assert body["error"]["code"] == "media_fetch_timeout"
    assert [path for path, _ in seen] == ["/a.png", "/away", "/slow.png"]


def test_local_media_policy(vision: ServerProcess, files: dict[str, Path]) -> None:
    allowed = files["allowed"]
    assert ask(vision.openai(), f"file://{allowed}/in.png").usage.prompt_tokens > 0
    for url in (f"file://{files['root']}/out.png", f"file://{allowed}/link.png"):
        body = refusal(vision.openai(), url)
        assert body["error"]["message"] == (
            "local media path is outside the directory --allowed-local-media allows"
        )


def test_a_local_path_that_is_no_regular_file_is_refused_at_once(
    vision: ServerProcess, files: dict[str, Path]
) -> None:
    """A FIFO held a thread per request until a writer came (eight held the whole pool, and
    every request after them), the directory itself was a 500: each is a 400 naming the part,
    and the server serves on."""
    fifo = files["allowed"] / "pipe.png"
    os.mkfifo(fifo)
    client = vision.openai().with_options(timeout=10, max_retries=0)
    for _ in range(10):
        for url in (f"file://{fifo}", f"file://{files['allowed']}", f"file://{files['allowed']}/"):
            error = refusal(client, url)["error"]
            assert error["message"] == "local media path is not a regular file", url
            assert error["param"] == "messages.0.content.1.image_url.url"
    assert ask(client, data_uri(PNG)).usage.prompt_tokens > 0


def test_a_text_model_refuses_images(client: openai.OpenAI) -> None:
    body = refusal(client, data_uri(PNG))
    assert body["error"] == {
        "message": "model does not support image input",
        "type": "invalid_request_error",
        "param": "messages.0.content.1",
        "code": "unsupported_modality",
    }


def test_audio_is_refused_where_the_model_hears_none(vision: ServerProcess) -> None:
    with vision.http() as http:
        part = {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}
        response = http.post(
            "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": [part]}], "max_tokens": 1},
        )
    assert response.status_code == 400
    assert response.json()["error"]["message"] == "model does not support audio input"


def test_modalities_are_listed(vision: ServerProcess, server: ServerProcess) -> None:
    with vision.http() as http:
        (listed,) = http.get("/v1/models").json()["data"]
        props = http.get("/props").json()
    assert listed["input_modalities"] == ["text", "image"]
    assert "vision" in listed["capabilities"]
    assert props["modalities"] == {"vision": True, "audio": False}
    with server.http() as http:
        assert http.get("/v1/models").json()["data"][0]["input_modalities"] == ["text"]
        assert http.get("/props").json()["modalities"]["vision"] is False


def test_responses_input_image(vision: ServerProcess) -> None:
    client = vision.openai()

    def create(*parts: dict[str, Any]) -> Any:
        content = [{"type": "input_text", "text": "Describe:"}, *parts]
        return client.responses.create(
            model="m",
            input=[{"role": "user", "content": content}],
            max_output_tokens=2,  # type: ignore[list-item]
        )

    plain = create().usage.input_tokens
    image = {"type": "input_image", "image_url": data_uri(PNG), "detail": "auto"}
    assert create(image).usage.input_tokens >= plain + PROJECTOR.image_tokens - 2


def test_anthropic_image_blocks(vision: ServerProcess, server: ServerProcess) -> None:
    claude = vision.anthropic()
    block = {
        "type": "image",
        "source": {
            "type": "base64",
            "media_type": "image/png",
            "data": data_uri(PNG).split(",", 1)[1],
        },
    }
    text = {"type": "text", "text": "Describe:"}

    def create(*blocks: dict[str, Any]) -> Any:
        return claude.messages.create(
            model="m",
            max_tokens=2,
            messages=[{"role": "user", "content": [text, *blocks]}],  # type: ignore[list-item]
        )

    def prompt_tokens(message: Any) -> int:
        # Anthropic's input_tokens leave out what the prefix cache read.
        return int(message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0))

    plain, one = prompt_tokens(create()), prompt_tokens(create(block))
    assert one >= plain + PROJECTOR.image_tokens - 2
    counted = claude.messages.count_tokens(
        model="m",
        messages=[{"role": "user", "content": [text, block]}],  # type: ignore[list-item]
    )
    assert counted.input_tokens == one
    with server.http() as http:
        response = http.post(
            "/v1/messages",
            json={
                "model": "m",
                "max_tokens": 2,
                "messages": [{"role": "user", "content": [block]}],
            },
        )
    assert response.status_code == 400
    assert response.json() == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "model does not support image input"},
    }


def _image_block() -> dict[str, Any]:
    data = data_uri(PNG).split(",", 1)[1]
    return {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}}


def test_anthropic_tool_result_images(vision: ServerProcess) -> None:
    claude = vision.anthropic()
    tool = {"name": "look", "description": "Take a picture", "input_schema": {"type": "object"}}

    def messages(*result: dict[str, Any]) -> list[Any]:
        call = {"type": "tool_use", "id": "toolu_1", "name": "look", "input": {}}
        content = [{"type": "text", "text": "the picture:"}, *result]
        answer = {"type": "tool_result", "tool_use_id": "toolu_1", "content": content}
        return [
            {"role": "user", "content": "Look."},
            {"role": "assistant", "content": [call]},
            {"role": "user", "content": [answer]},
        ]

    def counted(*result: dict[str, Any]) -> int:
        count = claude.messages.count_tokens(model="m", tools=[tool], messages=messages(*result))  # type: ignore[list-item]
        return count.input_tokens

    plain, one = counted(), counted(_image_block())
    assert one >= plain + PROJECTOR.image_tokens - 2
    answer = claude.messages.create(
        model="m",
        max_tokens=2,
        tools=[tool],
        messages=messages(_image_block()),  # type: ignore[list-item]
    )
    assert answer.usage.input_tokens + (answer.usage.cache_read_input_tokens or 0) == one
    with pytest.raises(anthropic.BadRequestError) as caught:
        claude.messages.create(
            model="m",
            max_tokens=2,
            messages=[
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": [_image_block()]},  # type: ignore[list-item]
            ],
        )
    assert caught.value.body == {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": "image blocks are read in user messages and their tool results, "
            "not in assistant turns",
        },
    }


def test_responses_history_keeps_its_images(vision: ServerProcess) -> None:
    client = vision.openai()

    def create(content: Any, previous: str | None = None) -> Any:
        return client.responses.create(
            model="m",
            input=[{"role": "user", "content": content}],
            previous_response_id=previous,
            max_output_tokens=1,
            temperature=0,
        )

    image = {"type": "input_image", "image_url": data_uri(PNG)}
    with_image = create([{"type": "input_text", "text": "Describe:"}, image])
    plain = create([{"type": "input_text", "text": "Describe:"}])
    assert with_image.usage.input_tokens >= plain.usage.input_tokens + PROJECTOR.image_tokens - 2
    # Follow-ups without images of their own: the first turn's image stays in the prompt,
    # through a chain of two (the one-token answers may retokenize a token or two apart).
    after = [create("And then?", with_image.id), create("And then?", plain.id)]
    assert after[0].usage.input_tokens >= after[1].usage.input_tokens + PROJECTOR.image_tokens - 4
    deeper = create("More?", after[0].id)
    assert deeper.usage.input_tokens > after[0].usage.input_tokens
    # A tool's output may carry an image too.
    call = {"type": "function_call", "call_id": "c1", "name": "look", "arguments": "{}"}
    output = [{"type": "input_text", "text": "the picture:"}, image]
    tool_turn = client.responses.create(
        model="m",
        input=[
            {"role": "user", "content": "Look."},
            call,
            {"type": "function_call_output", "call_id": "c1", "output": output},
        ],  # type: ignore[list-item]
        max_output_tokens=1,
    )
    assert tool_turn.usage.input_tokens > PROJECTOR.image_tokens


def _laid_out(generator: Any, question: str, image: Any) -> tuple[list[int], list[Any]]:
    tokens, spans = generator.tokenize_with_media(
        f"<|im_start|>user\n{question} {MEDIA_MARKER}<|im_end|>\n", [image]
    )
    return tokens, [(s.start, s.digest, s.embeddings.tobytes()) for s in spans]


def test_a_cached_image_is_laid_out_as_its_first_time(files: dict[str, Path]) -> None:
    """An image whose rows are cached goes to libmtmd as a tiny stand-in (its preprocessing
    is all the time a cache hit took): the prompt comes out as a fresh projector lays it out
    with the image itself. A stand-in laid out otherwise than its image (here: a token count
    made wrong) is not trusted again: the image itself is used, and the answer is the same."""
    image, other = (decode(image_bytes(color=c), 10**8) for c in (30, 90))

    def generator() -> LlamaCppGenerator:
        return LlamaCppGenerator(
            files["text"], LlamaCppOptions(1024, 1, 1, 512, 512, mmproj=files["mmproj"])
        )

    cached, fresh = generator(), generator()
    try:
        projector = cached._projector
        assert projector is not None
        stood_in: list[int] = []
        stand_in = projector._stand_in

        def counted(index: int) -> Any:
            stood_in.append(index)
            return stand_in(index)

        projector._stand_in = counted  # type: ignore[method-assign]
        _laid_out(cached, "First?", image)
        assert stood_in == []
        assert _laid_out(cached, "Second?", image) == _laid_out(fresh, "Second?", image)
        assert stood_in == [0]
        _laid_out(cached, "First?", other)
        wrong = PROJECTOR.image_tokens + 1
        projector._layouts.put(other.digest, wrong)
        projector._cache.put(rows_key(other.digest, wrong), np.zeros((wrong, 4), np.float32))
        assert _laid_out(cached, "Third?", other) == _laid_out(fresh, "Third?", other)
        assert not projector._stand_ins_fit
        assert _laid_out(cached, "Fourth?", image) == _laid_out(fresh, "Fourth?", image)
    finally:
        cached.close()
        fresh.close()


def test_each_slice_of_an_image_is_embedded_as_itself(
    tmp_path: Path, files: dict[str, Path]
) -> None:
    """An Idefics3-style projector cuts a large image into slices and an overview of the same
    token count, all carrying the image's id: each is its own span with its own rows (they
    used to share one cache key, so every chunk after the first got the first one's rows),
    and the image sent again is laid out the same from the cache."""
    mmproj = build_idefics3(PROJECTOR, tmp_path)
    generator = LlamaCppGenerator(
        files["text"], LlamaCppOptions(1024, 1, 1, 512, 512, mmproj=mmproj)
    )
    image = decode(noise_png(4 * PROJECTOR.image_size), 10**8)
    try:
        tokens, spans = _laid_out(generator, "Sliced?", image)
        assert len(spans) == 5  # 2 x 2 slices and the overview
        assert len({digest for _, digest, _ in spans}) == 5
        assert len({rows for _, _, rows in spans}) == 5
        assert _laid_out(generator, "Sliced?", image) == (tokens, spans)
    finally:
        generator.close()
