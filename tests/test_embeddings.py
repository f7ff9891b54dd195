"""Embeddings over HTTP: the real all-MiniLM-L6-v2 beside the chat model (on ONNX Runtime, the
default engine on Linux), through the OpenAI SDK, llama-server's /embedding, and the same model
on torch and as a BERT GGUF on llama.cpp."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest

from tests.conftest import ok, serving
from tests.encoder_models import minilm_dir, minilm_gguf
from tests.server_process import ServerProcess

PARAPHRASES = ("A man is eating food.", "A man is eating a piece of bread.")
UNRELATED = "The stock market fell sharply on Tuesday."
SENTENCES = [*PARAPHRASES, UNRELATED, "The girl is carrying a baby.", "A cat sat on the mat."]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The chat model with MiniLM beside it, on torch, a short request limit to test."""
    yield from serving(
        tmp_path_factory, "embed", "--embedding-model", "default", "--embedding-max-inputs", "8"
    )


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """MiniLM on the other engines: torch, MLX (mlx-embeddings on the CPU), and its weights as
    a GGUF on llama.cpp."""
    folder = tmp_path_factory.mktemp("minilm-engines")
    config = folder / "models.yaml"
    config.write_text(
        f"models:\n"
        f"  - model: {minilm_gguf(folder)}\n    kind: embedding\n    name: minilm-gguf\n"
        f"  - model: default\n    kind: embedding\n    name: minilm-torch\n"
        f"    embedding_engine: torch\n"
        f"  - model: default\n    kind: embedding\n    name: minilm-mlx\n"
        f"    embedding_engine: mlx\n"
    )
    yield from serving(tmp_path_factory, "embed-engines", "--config", str(config))


def vectors(server: ServerProcess, inputs: Any, **body: Any) -> np.ndarray:
    with server.http() as http:
        answer = ok(http.post("/v1/embeddings", json={"input": inputs, **body}))
    return np.array([d["embedding"] for d in sorted(answer["data"], key=lambda d: d["index"])])


def test_sdk_paraphrases_closer_than_unrelated(server: ServerProcess) -> None:
    client = server.openai()
    answer = client.embeddings.create(model="all-MiniLM-L6-v2", input=SENTENCES)
    got = np.array([d.embedding for d in answer.data])
    assert got.shape == (len(SENTENCES), 384)
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    paraphrase, unrelated = got[0] @ got[1], got[0] @ got[2]
    assert paraphrase > unrelated + 0.3, (paraphrase, unrelated)
    assert answer.model == "all-MiniLM-L6-v2"
    assert answer.usage.prompt_tokens == answer.usage.total_tokens > len(SENTENCES)


def test_langchain_openai_embeddings(server: ServerProcess) -> None:
    from langchain_openai import OpenAIEmbeddings

    reference = vectors(server, SENTENCES[:3])
    # LangChain's default tokenizes with tiktoken (OpenAI's ids, downloaded): another server's
    # models need check_embedding_ctx_length=False, as LangChain documents.
    langchain = OpenAIEmbeddings(
        model="all-MiniLM-L6-v2",
        base_url=server.base_url,
        api_key="x",  # type: ignore[arg-type]
        check_embedding_ctx_length=False,
        max_retries=0,
    )
    assert np.allclose(langchain.embed_documents(SENTENCES[:3]), reference, atol=1e-6)
    assert np.allclose(langchain.embed_query(SENTENCES[0]), reference[0], atol=1e-6)


@pytest.mark.slow
def test_litellm_embedding(server: ServerProcess, monkeypatch: pytest.MonkeyPatch) -> None:
    reference = vectors(server, SENTENCES[:3])
    # LiteLLM fetches its price list at import unless told to use the one it ships.
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    answer = litellm.embedding(
        model="openai/all-MiniLM-L6-v2", input=SENTENCES[:3], api_base=server.base_url, api_key="x"
    )
    got = [d["embedding"] for d in sorted(answer.data, key=lambda d: d["index"])]
    assert np.allclose(got, reference, atol=1e-6)
    assert answer.usage.prompt_tokens > len(SENTENCES[:3])


def test_base64_decodes_to_the_floats(server: ServerProcess) -> None:
    floats = vectors(server, SENTENCES[:2])
    with server.http() as http:
        answer = ok(
            http.post("/v1/embeddings", json={"input": SENTENCES[:2], "encoding_format": "base64"})
        )
    decoded = [np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in answer["data"]]
    assert np.array_equal(np.array(decoded), floats.astype(np.float32))


def test_deterministic_and_batched_equals_one_by_one(server: ServerProcess) -> None:
    batch = vectors(server, SENTENCES)
    assert np.array_equal(batch, vectors(server, SENTENCES))
    one_by_one = np.array([vectors(server, s)[0] for s in SENTENCES])
    assert np.allclose(batch, one_by_one, atol=1e-5)
    with ThreadPoolExecutor(len(SENTENCES)) as pool:
        concurrent = np.array([v[0] for v in pool.map(lambda s: vectors(server, s), SENTENCES)])
    assert np.allclose(concurrent, one_by_one, atol=1e-5)


def test_dimensions_truncate_and_renormalize(server: ServerProcess) -> None:
    full = vectors(server, SENTENCES[0], embd_normalize=-1)[0]
    cut = vectors(server, SENTENCES[0], dimensions=64)[0]
    assert cut.shape == (64,)
    assert np.allclose(cut, full[:64] / np.linalg.norm(full[:64]), atol=1e-5)
    with server.http() as http:
        too_wide = http.post("/v1/embeddings", json={"input": "x", "dimensions": 385})
    assert too_wide.status_code == 400
    assert too_wide.json()["error"]["param"] == "dimensions"


@pytest.mark.parametrize("norm", [-1, 0, 1, 2, 3])
def test_every_embd_normalize(server: ServerProcess, norm: int) -> None:
    raw = vectors(server, SENTENCES[0], embd_normalize=-1)[0]
    got = vectors(server, SENTENCES[0], embd_normalize=norm)[0]
    if norm == -1:
        assert np.linalg.norm(raw) > 1.5  # MiniLM's mean pooling is not unit length
        return
    scale = np.abs(raw).max() / 32760.0 if norm == 0 else np.linalg.norm(raw, ord=norm)
    assert np.allclose(got, raw / scale, rtol=1e-4)


def test_token_ids_and_usage_count_real_tokens(server: ServerProcess) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(minilm_dir()))
    ids = [tokenizer(s)["input_ids"] for s in SENTENCES[:3]]
    with server.http() as http:
        texts = ok(http.post("/v1/embeddings", json={"input": SENTENCES[:3]}))
        tokens = ok(http.post("/v1/embeddings", json={"input": ids}))
        single = ok(http.post("/v1/embeddings", json={"input": ids[0]}))
    assert texts["usage"]["prompt_tokens"] == sum(len(i) for i in ids)
    assert tokens["usage"] == texts["usage"]
    for a, b in zip(texts["data"], tokens["data"], strict=True):
        assert np.allclose(a["embedding"], b["embedding"], atol=1e-6)
    assert np.allclose(single["data"][0]["embedding"], texts["data"][0]["embedding"], atol=1e-6)


def test_limits_and_over_long_inputs(server: ServerProcess) -> None:
    long_text = "word " * 400
    with server.http() as http:
        many = http.post("/v1/embeddings", json={"input": ["a"] * 9})
        too_long = http.post("/v1/embeddings", json={"input": ["short", long_text]})
        cut = http.post("/v1/embeddings", json={"input": [long_text], "truncate": True})
        bad_id = http.post("/v1/embeddings", json={"input": [[101, 999999, 102]]})
        empty = http.post("/v1/embeddings", json={"input": []})
    assert many.status_code == 413
    assert "limit of 8" in many.json()["error"]["message"]
    assert too_long.status_code == 400
    message = too_long.json()["error"]["message"]
    assert "input 1" in message and "402 tokens" in message and "256" in message
    assert ok(cut)["usage"]["prompt_tokens"] == 256
    assert bad_id.status_code == 400 and "999999" in bad_id.json()["error"]["message"]
    assert empty.status_code == 400


def test_chat_model_cannot_embed_and_unknown_fields_are_named(server: ServerProcess) -> None:
    with server.http() as http:
        chat_name = ok(http.get("/v1/models"))["data"][0]["id"]
        wrong = http.post("/v1/embeddings", json={"input": "x", "model": chat_name})
        typo = http.post("/v1/embeddings", json={"input": "x", "encoding": "float"})
    assert wrong.status_code == 400
    assert "cannot do embeddings" in wrong.json()["error"]["message"]
    assert typo.status_code == 400 and typo.json()["error"]["param"] == "encoding"


def test_embedding_model_cannot_score_a_prompt(server: ServerProcess) -> None:
    body = {"model": "all-MiniLM-L6-v2", "prompt": "x", "echo": True, "logprobs": 1}
    with server.http() as http:
        response = http.post("/v1/completions", json=body)
    assert response.status_code == 400, response.text
    assert "all-MiniLM-L6-v2" in response.json()["error"]["message"]


def test_native_embedding_shape(server: ServerProcess) -> None:
    openai_shape = vectors(server, SENTENCES[:2])
    with server.http() as http:
        native = ok(http.post("/embedding", json={"content": SENTENCES[:2]}))
        bare = ok(http.post("/embeddings", json={"content": SENTENCES[0]}))
        bare_openai = ok(http.post("/embeddings", json={"input": SENTENCES[0]}))
    assert [item["index"] for item in native] == [0, 1]
    assert np.allclose([item["embedding"][0] for item in native], openai_shape, atol=1e-6)
    assert np.allclose(bare[0]["embedding"][0], openai_shape[0], atol=1e-6)
    assert bare_openai["object"] == "list"


def test_llama_server_input_objects_and_mixed_batches(server: ServerProcess) -> None:
    from transformers import AutoTokenizer

    texts = vectors(server, SENTENCES[:3])
    ids = AutoTokenizer.from_pretrained(str(minilm_dir()))(SENTENCES[1])["input_ids"]
    split = [{"type": "text", "text": SENTENCES[2][:9]}, {"type": "text", "text": SENTENCES[2][9:]}]
    mixed = vectors(server, [SENTENCES[0], ids, {"content": split}])
    objects = vectors(server, [{"prompt_string": SENTENCES[0]}, SENTENCES[1], SENTENCES[2]])
    assert np.allclose(mixed, texts, atol=1e-6) and np.allclose(objects, texts, atol=1e-6)
    assert np.allclose(vectors(server, {"prompt_string": SENTENCES[1]}), texts[1], atol=1e-6)
    # One input of ids and text, as llama-server's: ids as given, the text without [CLS]/[SEP]
    # (around the whole only when it starts with text).
    words = SENTENCES[1].split(" ", 3)
    start = AutoTokenizer.from_pretrained(str(minilm_dir()))(" ".join(words[:3]))["input_ids"]
    head = " ".join(words[:3])
    ids_first = [*start[:-1], words[3], start[-1]]
    assert np.allclose(vectors(server, ids_first), texts[1], atol=1e-6)
    text_first = vectors(server, [head, *start[1:-1]])
    assert np.allclose(text_first, vectors(server, f"{head} {head}"), atol=1e-6)
    batch = vectors(server, [ids_first, SENTENCES[0]])
    assert np.allclose(batch, texts[[1, 0]], atol=1e-6)
    with server.http() as http:
        native = ok(http.post("/embedding", json={"content": {"content": split}}))
        image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
        refused = [
            http.post("/v1/embeddings", json={"input": bad})
            for bad in (
                {"content": "string"},
                {"content": [image]},
                [{"prompt_string": "x <__media__>", "multimodal_data": ["AAAA"]}],
            )
        ]
    assert np.allclose(native[0]["embedding"][0], texts[2], atol=1e-6)
    assert [r.status_code for r in refused] == [400, 400, 400]
    assert refused[2].json()["error"]["param"] == "input.0.multimodal_data"


def test_instruction_is_prepended(server: ServerProcess) -> None:
    with_instruction = vectors(server, "eating food", instruction="query: ")
    prefixed = vectors(server, "query: eating food")
    assert np.allclose(with_instruction, prefixed, atol=1e-6)


@pytest.mark.slow
def test_every_engine_gives_the_same_vectors(server: ServerProcess, engines: ServerProcess) -> None:
    onnx_vectors = vectors(server, SENTENCES, embd_normalize=-1)
    torch_vectors = vectors(engines, SENTENCES, embd_normalize=-1, model="minilm-torch")
    assert np.allclose(onnx_vectors, torch_vectors, atol=1e-5)
    mlx_vectors = vectors(engines, SENTENCES, embd_normalize=-1, model="minilm-mlx")
    assert np.allclose(mlx_vectors, torch_vectors, atol=1e-4)
    torch_vectors = vectors(engines, SENTENCES, model="minilm-torch")
    gguf_vectors = vectors(engines, SENTENCES, model="minilm-gguf")
    cosines = np.sum(torch_vectors * gguf_vectors, axis=1)
    assert np.all(cosines > 0.9999), cosines
    with ThreadPoolExecutor(len(SENTENCES)) as pool:
        packed = np.array(
            [v[0] for v in pool.map(lambda s: vectors(engines, s, model="minilm-gguf"), SENTENCES)]
        )
    # Packed with other sequences, llama.cpp sums in another order: equal to float32 rounding.
    assert np.allclose(packed, gguf_vectors, atol=1e-4)
    with engines.http() as http:
        listed = {m["id"]: m["meta"]["backend"] for m in ok(http.get("/v1/models"))["data"]}
    assert listed == {"minilm-gguf": "llama.cpp", "minilm-torch": "torch", "minilm-mlx": "mlx"}


def test_listed_beside_the_chat_model_with_its_capability(server: ServerProcess) -> None:
    with server.http() as http:
        listed = {m["id"]: m for m in ok(http.get("/v1/models"))["data"]}
        unknown = http.post(
            "/v1/embeddings", json={"input": "x", "model": "text-embedding-3-small"}
        )
    embedder = listed["all-MiniLM-L6-v2"]
    assert embedder["capabilities"] == ["embedding"] and embedder["state"] == "loaded"
    assert embedder["meta"]["backend"] == "onnxruntime"
    assert ["text"] in [m["capabilities"] for m in listed.values()]
    # One embedding model here: a client's hard-coded OpenAI name is served by it.
    assert unknown.status_code == 200 and unknown.json()["model"] == "all-MiniLM-L6-v2"
