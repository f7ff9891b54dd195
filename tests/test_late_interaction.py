"""Late interaction: tiny random ColBERT models in PyLate's layout and the original checkpoints',
and a tiny ColQwen2, on one server; a matrix per input on /v1/embeddings (held to PyLate's
encoding, written out in tests/colbert_models.py, and to transformers' ColQwen2) and MaxSim on
/v1/rerank."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from bench.clip_models import png

from tests.colbert_models import (
    QUERY_LENGTH,
    build_colqwen,
    build_pylate,
    build_stanford,
    colqwen_encode,
    pylate_encode,
)
from tests.conftest import ok, serving
from tests.server_process import ServerProcess

DOCUMENTS = [
    "paris is the capital of france.",
    "the cat sat on the mat, today!",
    "rain today and sun tomorrow",
]
QUERY = "what is the capital of france?"
# Served name -> (folder name, query marker, document marker).
MODELS = {
    "colbert-pylate": ("pylate", "[Q] ", "[D] "),
    "colbert-stanford": ("stanford", "[unused0]", "[unused1]"),
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("colbert")
    return {
        "pylate": build_pylate(root / "pylate"),
        "stanford": build_stanford(root / "stanford"),
        "colqwen": build_colqwen(root / "colqwen"),
    }


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, folders: dict[str, Path]
) -> Iterator[ServerProcess]:
    config = folders["pylate"].parent / "models.yaml"
    config.write_text(
        "models:\n"
        f"  - model: {folders['pylate']}\n    kind: embedding\n    name: colbert-pylate\n"
        f"  - model: {folders['stanford']}\n    kind: embedding\n    name: colbert-stanford\n"
        f"  - model: {folders['colqwen']}\n    kind: embedding\n    name: colqwen\n"
    )
    yield from serving(tmp_path_factory, "late-interaction", "--config", str(config))


@pytest.fixture(params=list(MODELS))
def model(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


def post(server: ServerProcess, path: str, **body: Any) -> httpx.Response:
    with server.http() as http:
        return http.post(path, json=body)


def matrices(server: ServerProcess, model: str, inputs: Any, **body: Any) -> list[np.ndarray]:
    answer = ok(post(server, "/v1/embeddings", model=model, input=inputs, **body))
    return [np.array(d["embedding"]) for d in sorted(answer["data"], key=lambda d: d["index"])]


def test_matrices_equal_pylate(server: ServerProcess, folders: dict[str, Path], model: str) -> None:
    folder, query_marker, document_marker = MODELS[model]
    documents = matrices(server, model, DOCUMENTS)
    expected = pylate_encode(folders[folder], DOCUMENTS, False, document_marker, False)
    for got, want in zip(documents, expected, strict=True):
        # A row per token: [CLS], the marker, the words, [SEP]; punctuation left out.
        assert got.shape == want.shape
        assert np.allclose(got, want, atol=1e-4), np.abs(got - want).max()
    words = ["paris", "is", "the", "capital", "of", "france"]
    assert documents[0].shape[0] == 2 + len(words) + 1
    (query,) = matrices(server, model, [QUERY], input_type="query")
    (want,) = pylate_encode(folders[folder], [QUERY], True, query_marker, False)
    # Padded with [MASK] to the query length, every row kept.
    assert query.shape == want.shape == (QUERY_LENGTH, 16)
    assert np.allclose(query, want, atol=1e-4)
    cohere = matrices(server, model, [QUERY], input_type="search_query")[0]
    assert np.allclose(cohere, query, atol=1e-6)


def test_base64_has_the_shape(server: ServerProcess) -> None:
    floats = matrices(server, "colbert-pylate", DOCUMENTS[:2])
    answer = ok(
        post(
            server,
            "/v1/embeddings",
            model="colbert-pylate",
            input=DOCUMENTS[:2],
            encoding_format="base64",
        )
    )
    for item, expected in zip(answer["data"], floats, strict=True):
        assert item["shape"] == list(expected.shape)
        decoded = np.frombuffer(base64.b64decode(item["embedding"]), dtype="<f4")
        assert np.array_equal(decoded.reshape(item["shape"]), expected.astype(np.float32))


def test_maxsim_rerank(server: ServerProcess, model: str) -> None:
    query = "capital of france"
    documents = ["the capital of france", "rain and sun tomorrow", "python code"]
    answer = ok(post(server, "/v1/rerank", model=model, query=query, documents=documents))
    results = answer["results"]
    assert results[0]["index"] == 0, results
    (query_rows,) = matrices(server, model, [query], input_type="query")
    document_rows = matrices(server, model, documents)
    for result in results:
        rows = document_rows[result["index"]]
        expected = (query_rows @ rows.T).max(axis=1).sum()
        assert result["relevance_score"] == pytest.approx(expected, abs=1e-4)
    scores = [r["relevance_score"] for r in results]
    assert scores == sorted(scores, reverse=True)
    tei = ok(post(server, "/rerank", model=model, query=query, texts=documents))
    assert [(r["index"], pytest.approx(r["score"])) for r in tei] == [
        (r["index"], r["relevance_score"]) for r in results
    ]


def test_limits_and_refusals(server: ServerProcess) -> None:
    long_query = " ".join(["capital"] * 20)
    cases = {
        "image": dict(
            input=["a", {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]
        ),
        "long query": dict(input=[long_query], input_type="query"),
        "both": dict(input=["a"], input_type="query", instruction="query"),
        "bad type": dict(input=["a"], input_type="passage"),
    }
    answers = {
        name: post(server, "/v1/embeddings", model="colbert-pylate", **body)
        for name, body in cases.items()
    }
    assert {name: a.status_code for name, a in answers.items()} == dict.fromkeys(cases, 400)
    image = answers["image"].json()["error"]
    assert image["param"] == "input.1.image_url" and image["code"] == "unsupported_modality"
    assert "text only" in image["message"]
    assert f"maximum of {QUERY_LENGTH}" in answers["long query"].json()["error"]["message"]
    cut = matrices(server, "colbert-pylate", [long_query], input_type="query", truncate=True)
    assert cut[0].shape == (QUERY_LENGTH, 16)


def test_listed_as_multi_vector_rerankers(server: ServerProcess) -> None:
    with server.http() as http:
        listed = {m["id"]: m for m in ok(http.get("/v1/models"))["data"]}
    for name in [*MODELS, "colqwen"]:
        assert listed[name]["multi_vector"] is True
        assert listed[name]["capabilities"] == ["embedding", "rerank"]
        assert listed[name]["meta"]["backend"] == "torch"
        modalities = ["text", "image"] if name == "colqwen" else ["text"]
        assert listed[name]["input_modalities"] == modalities


def test_colqwen_pages_and_queries(server: ServerProcess, folders: dict[str, Path]) -> None:
    texts, pictures = ["a cat sat", "the dog"], [png(1, (56, 56)), png(2, (84, 56))]
    pages = [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + encoded}}
        for encoded in (base64.b64encode(p).decode() for p in pictures)
    ]
    got = matrices(server, "colqwen", [*texts, *pages], input_type="query")
    expected = colqwen_encode(folders["colqwen"], texts, pictures)
    for matrix, want in zip(got, expected, strict=True):
        assert matrix.shape == want.shape
        assert np.allclose(matrix, want, atol=1e-4), np.abs(matrix - want).max()
    # A query scores a page by MaxSim from the same matrices.
    scores = [(got[0] @ page.T).max(axis=1).sum() for page in got[2:]]
    assert all(np.isfinite(scores))
