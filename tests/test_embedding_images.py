"""Images on /v1/embeddings: a tiny random CLIP in sentence-transformers' layout on ONNX Runtime
(the default engine on Linux) and a tiny SigLIP in Hugging Face's layout on torch, one server;
every vector held to transformers' own forward pass on the folder."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from bench.clip_models import build_siglip, build_st_clip, png

from tests.conftest import ok, serving
from tests.server_process import ServerProcess

TEXTS = ["a cat sat on the mat", "the dog"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("image-text")
    return {"clip": build_st_clip(root / "tiny-clip"), "siglip": build_siglip(root / "tiny-siglip")}


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, folders: dict[str, Path]
) -> Iterator[ServerProcess]:
    config = folders["clip"].parent / "models.yaml"
    config.write_text(
        "models:\n"
        f"  - model: {folders['clip']}\n    kind: embedding\n    name: clip\n"
        f"  - model: {folders['siglip']}\n    kind: embedding\n    name: siglip\n"
        "    embedding_engine: torch\n"
    )
    yield from serving(
        tmp_path_factory, "embed-images", "--config", str(config), "--media-max-images", "3"
    )


def data_uri(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def image(data: bytes) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": data_uri(data)}}


def post(server: ServerProcess, model: str, inputs: Any, **body: Any) -> httpx.Response:
    with server.http() as http:
        return http.post("/v1/embeddings", json={"model": model, "input": inputs, **body})


def vectors(server: ServerProcess, model: str, inputs: Any, **body: Any) -> np.ndarray:
    answer = ok(post(server, model, inputs, **body))
    return np.array([d["embedding"] for d in sorted(answer["data"], key=lambda d: d["index"])])


def reference(folder: Path, texts: list[str], pictures: list[bytes]) -> np.ndarray:
    """transformers' own features of the texts then the images, as its processor prepares
    them (SigLIP's texts padded to its length, as its model card says)."""
    import torch
    from PIL import Image
    from transformers import AutoModel, AutoProcessor

    model = AutoModel.from_pretrained(str(folder)).eval()
    processor = AutoProcessor.from_pretrained(str(folder))
    padding = "max_length" if model.config.model_type == "siglip" else True
    opened = [Image.open(io.BytesIO(p)).convert("RGB") for p in pictures]
    inputs = processor(text=texts, images=opened, padding=padding, return_tensors="pt")
    pixels = inputs.pop("pixel_values")
    with torch.no_grad():
        text = model.get_text_features(**inputs)
        picture = model.get_image_features(pixel_values=pixels)
    pooled = [getattr(out, "pooler_output", out) for out in (text, picture)]
    return torch.cat(pooled).numpy()


@pytest.mark.parametrize("model", ["clip", "siglip"])
def test_vectors_equal_transformers(
    server: ServerProcess, folders: dict[str, Path], model: str
) -> None:
    pictures = [png(1), png(2, (64, 30))]
    got = vectors(server, model, [*TEXTS, *(image(p) for p in pictures)], embd_normalize=-1)
    # sentence-transformers' CLIP module folder holds the transformers folder.
    folder = folders[model] / "0_CLIPModel" if model == "clip" else folders[model]
    expected = reference(folder, TEXTS, pictures)
    assert got.shape == expected.shape  # texts and images share one width
    assert np.allclose(got, expected, atol=1e-4), np.abs(got - expected).max()


def test_every_input_shape_and_determinism(server: ServerProcess) -> None:
    first, second = png(4), png(5)
    encoded = base64.b64encode(first).decode()
    shapes: list[Any] = [
        image(first),
        {"image_url": {"url": data_uri(first)}},
        {"image_url": data_uri(first)},
        {"image": data_uri(first)},
    ]
    # Three at a time: the server allows three images a request.
    got = np.concatenate([vectors(server, "clip", shapes[:3]), vectors(server, "clip", shapes[3:])])
    assert np.allclose(got, got[0], atol=1e-6)
    assert np.allclose(vectors(server, "clip", [{"image": encoded}])[0], got[0], atol=1e-6)
    again = vectors(server, "clip", [image(first), image(second), {"text": TEXTS[0]}])
    assert np.allclose(again[0], got[0], atol=1e-6)
    assert not np.allclose(again[0], again[1], atol=1e-3)
    typed = vectors(server, "clip", [{"type": "text", "text": TEXTS[0]}])
    assert np.allclose(typed[0], again[2], atol=1e-6)
    assert np.allclose(vectors(server, "clip", TEXTS[0])[0], again[2], atol=1e-6)
    assert np.allclose(np.linalg.norm(again, axis=1), 1.0, atol=1e-5)


def test_base64_and_usage(server: ServerProcess) -> None:
    floats = vectors(server, "clip", [image(png(6))])
    answer = ok(post(server, "clip", [image(png(6)), "a cat"], encoding_format="base64"))
    decoded = np.frombuffer(base64.b64decode(answer["data"][0]["embedding"]), dtype="<f4")
    assert np.array_equal(decoded, floats[0].astype(np.float32))
    # An image counts its patches (and CLIP's class token): 4x4 + 1.
    text_tokens = ok(post(server, "clip", ["a cat"]))["usage"]["prompt_tokens"]
    assert answer["usage"]["prompt_tokens"] == text_tokens + 17


def test_refusals_name_the_image(server: ServerProcess) -> None:
    truncated = data_uri(png(7)[:120])
    cases = {
        "garbage": (
            ["a", {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]
        ),
        "truncated": ["a", "b", {"image_url": {"url": truncated}}],
        "remote": [{"image_url": {"url": "https://example.com/cat.png"}}],
        "bare": [{"image": "not an image at all"}],
        "too many": [image(png(i)) for i in range(4)],
    }
    answers = {name: post(server, "clip", inputs) for name, inputs in cases.items()}
    for name, answer in answers.items():
        assert answer.status_code == 400, (name, answer.text)
    errors = {name: answer.json()["error"] for name, answer in answers.items()}
    assert errors["garbage"]["param"] == "input.1.image_url"
    assert errors["garbage"]["code"] == "invalid_image"
    assert errors["truncated"]["param"] == "input.2.image_url"
    assert "decode" in errors["truncated"]["message"]
    assert errors["remote"]["code"] == "media_not_allowed"
    assert errors["bare"]["param"] == "input.0.image"
    assert errors["too many"]["code"] == "too_many_images"
    # The model still answers after each refusal.
    assert vectors(server, "clip", [image(png(8))]).shape == (1, 24)


def test_listed_with_their_modalities(server: ServerProcess) -> None:
    with server.http() as http:
        listed = {m["id"]: m for m in ok(http.get("/v1/models"))["data"]}
    for name in ("clip", "siglip"):
        assert listed[name]["input_modalities"] == ["text", "image"]
        assert listed[name]["multi_vector"] is False
        assert listed[name]["capabilities"] == ["embedding"]
    assert listed["clip"]["meta"]["backend"] == "onnxruntime"
    assert listed["siglip"]["meta"]["backend"] == "torch"


@pytest.mark.slow
def test_playground_ranks_documents_against_an_image(server: ServerProcess, tmp_path: Path) -> None:
    from playwright.sync_api import expect, sync_playwright

    from tests.test_webui import CHROMIUM, CHROMIUM_ARGS

    query = tmp_path / "query.png"
    query.write_bytes(png(9))
    documents = ["a cat", "the dog sat", "python code"]
    errors: list[str] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True
        )
        page = browser.new_page()
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.goto(server.root + "/")
        page.wait_for_selector("body[data-ready=true]")
        page.click("button.tab[data-view=scores]")
        panel = page.locator("#panel-scores")
        panel.locator("select").select_option(label="clip")
        panel.locator("input[name=image]").set_input_files(str(query))
        panel.locator("textarea[name=documents]").fill("\n".join(documents))
        with page.expect_request(lambda r: r.url.endswith("/v1/embeddings")) as request:
            panel.locator("button[type=submit]").click()
        rows = panel.locator("table.scores tr")
        expect(rows).to_have_count(len(documents))
        shown = [
            (cells[2], float(cells[0]))
            for cells in (rows.nth(i).locator("td").all_inner_texts() for i in range(3))
        ]
        sent = request.value.post_data_json["input"]
        browser.close()
    assert sent[0] == {"type": "image_url", "image_url": {"url": data_uri(png(9))}}
    assert sent[1:] == documents
    got = vectors(server, "clip", [image(png(9)), *documents])
    expected = sorted(
        ((text, float(got[0] @ got[i + 1])) for i, text in enumerate(documents)),
        key=lambda row: -row[1],
    )
    assert [t for t, _ in shown] == [t for t, _ in expected]
    assert np.allclose([s for _, s in shown], [s for _, s in expected], atol=1e-4)
    assert errors == []
