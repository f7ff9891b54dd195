"""Reranking over HTTP: a tiny random-weight BERT cross-encoder through transformers, and the
same weights as a rank-pooling GGUF through llama.cpp; Jina/Cohere's and TEI's shapes."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
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


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_reranker(tmp_path_factory.mktemp("reranker") / "tiny-reranker")


@pytest.fixture(scope="module", params=["transformers", "llama.cpp"])
def server(
    request: pytest.FixtureRequest, folder: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    model = folder if request.param == "transformers" else reranker_gguf(folder, folder.parent)
    yield from serving(
        tmp_path_factory, "rerank", "--reranker-model", str(model), "--rerank-max-documents", "6"
    )


def post(server: ServerProcess, path: str, **body: Any) -> httpx.Response:
    with server.http() as http:
        return http.post(path, json=body)


def test_jina_shape_sorted_and_deterministic(server: ServerProcess) -> None:
    answer = ok(post(server, "/v1/rerank", query=QUERY, documents=DOCUMENTS))
    results = answer["results"]
    assert answer["object"] == "list" and answer["usage"]["prompt_tokens"] > 0
    assert sorted(r["index"] for r in results) == list(range(len(DOCUMENTS)))
    scores = [r["relevance_score"] for r in results]
    assert scores == sorted(scores, reverse=True)
    assert all(0.0 < s < 1.0 for s in scores)
    assert len(set(scores)) == len(scores)  # distinct, so the order is the scores' own
    for r in results:
        assert r["document"] == {"text": DOCUMENTS[r["index"]]}
    again = ok(post(server, "/rerank", query=QUERY, documents=[{"text": d} for d in DOCUMENTS]))
    assert again["results"] == results


def test_top_n_and_return_documents(server: ServerProcess) -> None:
    full = ok(post(server, "/v1/rerank", query=QUERY, documents=DOCUMENTS))["results"]
    top = ok(
        post(
            server,
            "/v1/reranking",
            query=QUERY,
            documents=DOCUMENTS,
            top_n=2,
            return_documents=False,
        )
    )["results"]
    assert [r["index"] for r in top] == [r["index"] for r in full[:2]]
    assert all("document" not in r for r in top)


def test_tei_shape_with_raw_scores(server: ServerProcess) -> None:
    jina = ok(post(server, "/v1/rerank", query=QUERY, documents=DOCUMENTS))["results"]
    tei = ok(post(server, "/reranking", query=QUERY, texts=DOCUMENTS, return_text=True))
    assert isinstance(tei, list)
    assert [(t["index"], t["score"]) for t in tei] == [
        (r["index"], r["relevance_score"]) for r in jina
    ]
    assert all(t["text"] == DOCUMENTS[t["index"]] for t in tei)
    raw = ok(post(server, "/v1/rerank", query=QUERY, texts=DOCUMENTS, raw_scores=True))
    for logit, prob in zip(raw, tei, strict=True):
        assert math.isclose(1 / (1 + math.exp(-logit["score"])), prob["score"], rel_tol=1e-9)
    assert "text" not in raw[0]


def test_bad_requests(server: ServerProcess) -> None:
    cases = [
        ({"documents": DOCUMENTS}, 400, "query"),
        ({"query": " ", "documents": DOCUMENTS}, 400, "query"),
        ({"query": QUERY, "documents": []}, 400, "documents"),
        ({"query": QUERY}, 400, "documents"),
        ({"query": QUERY, "documents": ["a"] * 7}, 413, "documents"),
        ({"query": QUERY, "documents": ["capital " * 200]}, 400, "documents"),
    ]
    for body, status, param in cases:
        answer = post(server, "/v1/rerank", **body)
        assert answer.status_code == status, (body, answer.text)
        assert answer.json()["error"]["param"] == param
    cut = ok(post(server, "/v1/rerank", query=QUERY, texts=["capital " * 200], truncate=True))
    assert len(cut) == 1


def test_no_embeddings_here(server: ServerProcess) -> None:
    answer = post(server, "/v1/embeddings", input="x")
    assert answer.status_code == 400
    assert "--embedding-model" in answer.json()["error"]["message"]
