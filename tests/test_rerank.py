"""Reranking over HTTP: a tiny random-weight BERT cross-encoder on ONNX Runtime and on torch,
and the same weights as a rank-pooling GGUF on llama.cpp, all three on one server; Jina/Cohere's,
Cohere v2's and TEI's shapes."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import ok, serving
from tests.encoder_models import build_reranker, reranker_gguf
from tests.server_process import ServerProcess

QUERY = "what is the capital of france?"
DOCUMENTS = [
    "paris is the capital of france",
    "the cat sat on the mat",
    "berlin is the capital of germany",
    "python code",
    "rain today and sun tomorrow",
]
# Served name -> the engine /v1/models names.
ENGINES = {"tiny-onnx": "onnxruntime", "tiny-torch": "torch", "tiny-gguf": "llama.cpp"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    folder = build_reranker(tmp_path_factory.mktemp("reranker") / "tiny-reranker")
    config = folder.parent / "models.yaml"
    config.write_text(
        f"models:\n"
        f"  - model: {folder}\n    kind: rerank\n    name: tiny-onnx\n"
        f"  - model: {folder}\n    kind: rerank\n    name: tiny-torch\n"
        f"    embedding_engine: torch\n"
        f"  - model: {reranker_gguf(folder, folder.parent)}\n    kind: rerank\n"
        f"    name: tiny-gguf\n"
    )
    yield from serving(
        tmp_path_factory, "rerank", "--config", str(config), "--rerank-max-documents", "6"
    )


@pytest.fixture(params=list(ENGINES))
def model(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


def post(server: ServerProcess, model: str, path: str, **body: Any) -> httpx.Response:
    with server.http() as http:
        return http.post(path, json={"model": model, **body})


def test_jina_shape_sorted_and_deterministic(server: ServerProcess, model: str) -> None:
    answer = ok(post(server, model, "/v1/rerank", query=QUERY, documents=DOCUMENTS))
    results = answer["results"]
    assert answer["object"] == "list" and answer["usage"]["prompt_tokens"] > 0
    assert sorted(r["index"] for r in results) == list(range(len(DOCUMENTS)))
    scores = [r["relevance_score"] for r in results]
    assert scores == sorted(scores, reverse=True)
    assert all(0.0 < s < 1.0 for s in scores)
    assert len(set(scores)) == len(scores)  # distinct, so the order is the scores' own
    for r in results:
        assert r["document"] == {"text": DOCUMENTS[r["index"]]}
    again = ok(
        post(server, model, "/rerank", query=QUERY, documents=[{"text": d} for d in DOCUMENTS])
    )
    assert again["results"] == results


def test_top_n_and_return_documents(server: ServerProcess, model: str) -> None:
    full = ok(post(server, model, "/v1/rerank", query=QUERY, documents=DOCUMENTS))["results"]
    top = ok(
        post(
            server,
            model,
            "/v1/reranking",
            query=QUERY,
            documents=DOCUMENTS,
            top_n=2,
            return_documents=False,
        )
    )["results"]
    assert [r["index"] for r in top] == [r["index"] for r in full[:2]]
    assert all("document" not in r for r in top)


def test_tei_shape_with_raw_scores(server: ServerProcess, model: str) -> None:
    jina = ok(post(server, model, "/v1/rerank", query=QUERY, documents=DOCUMENTS))["results"]
    tei = ok(post(server, model, "/reranking", query=QUERY, texts=DOCUMENTS, return_text=True))
    assert isinstance(tei, list)
    assert [(t["index"], t["score"]) for t in tei] == [
        (r["index"], r["relevance_score"]) for r in jina
    ]
    assert all(t["text"] == DOCUMENTS[t["index"]] for t in tei)
    raw = ok(post(server, model, "/v1/rerank", query=QUERY, texts=DOCUMENTS, raw_scores=True))
    for logit, prob in zip(raw, tei, strict=True):
        assert math.isclose(1 / (1 + math.exp(-logit["score"])), prob["score"], rel_tol=1e-9)
    assert "text" not in raw[0]


def test_bad_requests(server: ServerProcess, model: str) -> None:
    cases = [
        ({"documents": DOCUMENTS}, 400, "query"),
        ({"query": " ", "documents": DOCUMENTS}, 400, "query"),
        ({"query": QUERY, "documents": []}, 400, "documents"),
        ({"query": QUERY}, 400, "documents"),
        ({"query": QUERY, "documents": ["a"] * 7}, 413, "documents"),
        ({"query": QUERY, "documents": ["capital " * 200]}, 400, "documents"),
    ]
    for body, status, param in cases:
        answer = post(server, model, "/v1/rerank", **body)
        assert answer.status_code == status, (body, answer.text)
        assert answer.json()["error"]["param"] == param
    cut = ok(
        post(server, model, "/v1/rerank", query=QUERY, texts=["capital " * 200], truncate=True)
    )
    assert len(cut) == 1


def test_a_text_too_large_for_the_model_is_refused_before_tokenizing(
    server: ServerProcess, model: str
) -> None:
    """A 30 MB query or document took seconds of tokenizing before its 400 (19-40 s on
    MiniLM): its size alone refuses it now, on every engine; truncate: true cuts a document
    first, and the answer gives it back as it was sent."""
    huge = "capital " * 3_750_000
    for body, param in (
        ({"query": huge, "documents": DOCUMENTS}, "query"),
        ({"query": QUERY, "documents": [huge]}, "documents"),
        ({"query": huge, "documents": DOCUMENTS, "truncate": True}, "query"),
    ):
        started = time.monotonic()
        answer = post(server, model, "/v1/rerank", **body)
        assert time.monotonic() - started < 5
        assert answer.status_code == 400, answer.text
        assert (answer.json()["error"]["param"], answer.json()["error"]["code"]) == (
            param,
            "input_too_long",
        )
    started = time.monotonic()
    cut = ok(post(server, model, "/v1/rerank", query=QUERY, documents=[huge], truncate=True))
    assert time.monotonic() - started < 5
    assert cut["results"][0]["document"]["text"] == huge


def test_cohere_v2_shape(server: ServerProcess, model: str) -> None:
    jina = ok(post(server, model, "/v1/rerank", query=QUERY, documents=DOCUMENTS))
    v2 = ok(post(server, model, "/v2/rerank", query=QUERY, documents=DOCUMENTS, top_n=3))
    assert set(v2) == {"id", "results", "meta"} and v2["id"]
    assert v2["results"] == [
        {"index": r["index"], "relevance_score": r["relevance_score"]} for r in jina["results"][:3]
    ]
    assert v2["meta"]["api_version"] == {"version": "2"}
    assert v2["meta"]["tokens"]["input_tokens"] == jina["usage"]["prompt_tokens"]
    texts = post(server, model, "/v2/rerank", query=QUERY, texts=DOCUMENTS)
    assert texts.status_code == 400 and texts.json()["error"]["param"] == "texts"


def test_onnx_gives_the_scores_of_torch(server: ServerProcess) -> None:
    # llama.cpp's sums differ by ~1e-3 here, more than this random head's spread of scores:
    # the llama.cpp engine's agreement is tested on MiniLM (test_embeddings).
    raw = {
        name: [
            t["score"]
            for t in ok(
                post(server, name, "/rerank", query=QUERY, texts=DOCUMENTS, raw_scores=True)
            )
        ]
        for name in ENGINES
    }
    assert raw["tiny-onnx"] == pytest.approx(raw["tiny-torch"], abs=1e-4)
    with server.http() as http:
        listed = {m["id"]: m["meta"]["backend"] for m in ok(http.get("/v1/models"))["data"]}
    assert listed == ENGINES


def test_no_embeddings_here(server: ServerProcess) -> None:
    answer = post(server, "tiny-onnx", "/v1/embeddings", input="x")
    assert answer.status_code == 400
    assert "--embedding-model" in answer.json()["error"]["message"]
