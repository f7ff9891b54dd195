"""Continuous batching on the MLX engine: sequences decoded together, each as if alone.

Every sampled token of a step comes out of one forward pass over all decoding sequences; these
tests check, over real HTTP, that a request's output does not depend on its company.
"""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest

pytest.importorskip("mlx_lm")

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.models import llama4

from mlxcel.backends.mlx import MlxGenerator, MlxOptions
from tests.conftest import LLAMA_DIR, serving, start
from tests.server_process import ServerProcess

pytestmark = pytest.mark.slow

SLOTS = 4
PET = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "kind": {"enum": ["cat", "dog", "bird"]},
        "age": {"type": "integer", "minimum": 0, "maximum": 30},
    },
    "required": ["name", "kind", "age"],
    "additionalProperties": False,
}
# Tokens a request may take to end by itself (test_greedy_rows_picked_together...).
LIMIT = 300
# Greedy to the limit: the same request must give the same tokens, token for token.
GREEDY: dict[str, Any] = {"temperature": 0, "extra_body": {"ignore_eos": True}}

Request = Callable[[openai.OpenAI], Any]


@pytest.fixture(scope="module")
def mlx_server(models: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    yield from serving(
        tmp_path_factory,
        "mlx-batching",
        *("-m", str(models / LLAMA_DIR), "--backend", "mlx", "-np", str(SLOTS), "-c", "8192"),
    )


@pytest.fixture(scope="module")
def client(mlx_server: ServerProcess) -> openai.OpenAI:
    return mlx_server.openai()


def chat(content: str, max_tokens: int, **kwargs: Any) -> Request:
    """A chat request whose answer is its text, finish reason and log-probabilities."""

    def send(client: openai.OpenAI) -> Any:
        response = client.chat.completions.create(
            model="default",
            messages=[{"role": "user", "content": content}],
            max_tokens=max_tokens,
            **kwargs,
        )
        choice = response.choices[0]
        logprobs = choice.logprobs.model_dump() if choice.logprobs else None
        return choice.message.content, choice.finish_reason, logprobs

    return send


def completion(prompt: str, max_tokens: int, **kwargs: Any) -> Request:
    """A legacy completion whose answer is its text and finish reason."""

    def send(client: openai.OpenAI) -> Any:
        response = client.completions.create(
            model="default", prompt=prompt, max_tokens=max_tokens, **kwargs
        )
        return response.choices[0].text, response.choices[0].finish_reason

    return send


def together(client: openai.OpenAI, requests: list[Request]) -> list[Any]:
    """Send every request at the same moment; their answers in order."""
    barrier = threading.Barrier(len(requests))

    def send(request: Request) -> Any:
        barrier.wait()
        return request(client)

    with ThreadPoolExecutor(len(requests)) as pool:
        return list(pool.map(send, requests))


def alone(client: openai.OpenAI, requests: list[Request]) -> list[Any]:
    """Send the requests one after another."""
    return [request(client) for request in requests]


def test_greedy_outputs_are_the_same_alone_and_batched(client: openai.OpenAI) -> None:
    requests = [
        chat("Tell me a story about a cat.", 40, **GREEDY),
        completion("The", 25, **GREEDY),
        chat("Paris, London, Berlin, Rome, Madrid and Tokyo are cities.", 60, **GREEDY),
        completion("Once upon a time a dragon and a king sat by the river", 33, **GREEDY),
    ]
    expected = alone(client, requests)
    assert len({answer[0] for answer in expected}) == len(requests)
    assert together(client, requests) == expected
    # Reversed, so each request runs in another slot, row and company.
    assert together(client, requests[::-1]) == expected[::-1]


def test_greedy_rows_picked_together_match_rows_picked_one_by_one(client: openai.OpenAI) -> None:
    # Plain greedy rows that ban the same ids take their tokens in one argmax; asking for
    # logprobs sends a row through its own sampler chain. Each pair must agree token for token,
    # on a prompt whose greedy answer ends by itself: with the end token banned and without.
    # The first of many prompts whose greedy answer ends by itself (here a quarter of them
    # do within the limit; another machine's float rounding may pick another).
    free = {"temperature": 0}
    words = ("a b c", "Paris", "Hello", "Name a city.", "The", "Rome", "cat", "king")
    candidates = (f"{word} {n}" if n else word for n in range(4) for word in words)
    prompt = next((p for p in candidates if chat(p, LIMIT, **free)(client)[1] == "stop"), None)
    assert prompt is not None, f"no prompt's greedy answer ends within {LIMIT} tokens"

    def answer(**kwargs: Any) -> Request:
        return lambda client: chat(prompt, LIMIT, **kwargs)(client)[:2]

    requests = [
        answer(**GREEDY),
        answer(logprobs=True, **GREEDY),
        answer(**free),
        answer(logprobs=True, **free),
    ]
    answers = together(client, requests)
    assert answers[0] == answers[1]
    assert answers[0][1] == "length"
    assert answers[2] == answers[3]
    assert answers[2][1] == "stop"
    assert alone(client, requests) == answers


def test_seeded_sampling_is_the_same_alone_and_batched(client: openai.OpenAI) -> None:
    hot = {"temperature": 1.0, "extra_body": {"top_k": 0, "ignore_eos": True}}
    requests = [
        chat("Tell me a story about a dog.", 30, seed=7, **hot),
        chat("Tell me a story about a dog.", 30, seed=8, **hot),
        completion("The king said", 20, seed=7, top_p=0.9, **hot),
        chat("Name a city.", 45, seed=3, presence_penalty=1.0, frequency_penalty=0.5, **hot),
    ]
    expected = alone(client, requests)
    assert expected[0] != expected[1]
    assert together(client, requests) == expected


def test_a_cancelled_stream_leaves_the_others_undisturbed(client: openai.OpenAI) -> None:
    requests = [
        chat("Tell me a story about a bird.", 50, **GREEDY),
        completion("Four five six", 50, **GREEDY),
        chat("What is the answer to the question?", 50, **GREEDY),
    ]
    expected = alone(client, requests)

    def cancelled(client: openai.OpenAI) -> int:
        stream = client.completions.create(
            model="default", prompt="One two three", max_tokens=1000, stream=True, **GREEDY
        )
        received = 0
        for received, _ in enumerate(stream, start=1):
            if received == 5:
                break
        stream.close()
        return received

    answers = together(client, [cancelled, *requests])
    assert answers == [5, *expected]


def test_logprobs_and_a_json_schema_in_one_batch(client: openai.OpenAI) -> None:
    schema = {"type": "json_schema", "json_schema": {"name": "pet", "schema": PET}}
    requests = [
        chat("Tell me about a horse.", 20, logprobs=True, top_logprobs=3, **GREEDY),
        chat("Describe a pet.", 200, temperature=0, response_format=schema),
        chat("Describe a pet.", 200, temperature=0.8, seed=3, response_format=schema),
        completion("The dragon", 30, **GREEDY),
    ]
    expected = alone(client, requests)
    batched = together(client, requests)
    assert batched == expected
    _, reason, logprobs = batched[0]
    assert reason == "length" and len(logprobs["content"]) == 20
    assert all(len(entry["top_logprobs"]) == 3 for entry in logprobs["content"])
    for text, reason, _ in batched[1:3]:
        assert reason == "stop"
        jsonschema.validate(json.loads(text), PET)


def test_slots_and_metrics_show_the_sequences_running_together(
    client: openai.OpenAI, mlx_server: ServerProcess
) -> None:
    streams = [
        client.completions.create(
            model="default", prompt=f"Count {n}:", max_tokens=1500, stream=True, **GREEDY
        )
        for n in range(SLOTS)
    ]
    try:
        # A stream's first chunk comes once its sequence decodes: then all are in the batch.
        for stream in streams:
            next(iter(stream))
        with mlx_server.http() as http:
            slots = http.get("/slots").json()
            metrics = http.get("/metrics").text
    finally:
        for stream in streams:
            stream.close()
    assert sum(slot["is_processing"] for slot in slots) == SLOTS
    running = next(
        line for line in metrics.splitlines() if line.startswith("mlxcel_requests_running")
    )
    assert float(running.split()[-1]) == SLOTS


def _variant(models: Path, target: Path, config: dict[str, Any]) -> Path:
    """The tiny Llama's tokenizer with another model config (and its weights, if the config
    changes their shapes)."""
    shutil.copytree(models / LLAMA_DIR, target)
    (target / "config.json").write_text(json.dumps(config))
    return target


def _sliding_window(models: Path, target: Path) -> Path:
    """The tiny Llama with its first layer attending to the last 8 tokens: a rotating cache."""
    config = json.loads((models / LLAMA_DIR / "config.json").read_text())
    layers = {"layer_types": ["sliding_attention", "full_attention"], "sliding_window": 8}
    return _variant(models, target, {**config, **layers})


def _chunked_attention(models: Path, target: Path) -> Path:
    """A tiny random Llama 4: chunked attention caches, which mlx-lm cannot batch."""
    vocab = json.loads((models / LLAMA_DIR / "config.json").read_text())["vocab_size"]
    text = {
        "model_type": "llama4_text",
        "attention_bias": False,
        "attention_chunk_size": 8,
        "head_dim": 16,
        "hidden_size": 64,
        "interleave_moe_layer_step": 2,
        "intermediate_size": 64,
        "intermediate_size_mlp": 128,
        "max_position_embeddings": 4096,
        "num_attention_heads": 4,
        "num_experts_per_tok": 1,
        "num_hidden_layers": 4,
        "num_key_value_heads": 2,
        "num_local_experts": 2,
        "rms_norm_eps": 1e-5,
        "rope_scaling": None,
        "rope_theta": 10000.0,
        "use_qk_norm": True,
        "vocab_size": vocab,
    }
    config = {"model_type": "llama4", "text_config": text}
    target = _variant(models, target, config)
    model = llama4.Model(llama4.ModelArgs.from_dict(config))
    mx.save_safetensors(str(target / "model.safetensors"), dict(tree_flatten(model.parameters())))
    return target


@pytest.fixture(scope="module")
def variants(models: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("mlx-cache-kinds")
    return {
        "sliding": _sliding_window(models, root / "sliding"),
        "chunked": _chunked_attention(models, root / "chunked"),
    }


@pytest.mark.parametrize(("kind", "batched"), [("sliding", True), ("chunked", False)])
def test_each_cache_kind_decodes_the_same_alone_and_together(
    variants: dict[str, Path], tmp_path: Path, kind: str, batched: bool
) -> None:
    generator = MlxGenerator(variants[kind], MlxOptions(ctx_size=4096, parallel=3, batch_size=8))
    try:
        assert generator.batched is batched
    finally:
        generator.close()
    # A batch of 8 tokens makes the prompts arrive in chunks, past the 8-token window.
    server = start(tmp_path, "-m", str(variants[kind]), "--backend", "mlx", "-np", "3", "-b", "8")
    try:
        client = server.openai()
        requests = [
            chat("Tell me a story about a cat, a dog and a dragon.", 40, **GREEDY),
            completion("The", 30, **GREEDY),
            chat("One two three four five six seven eight nine ten.", 50, **GREEDY),
        ]
        expected = alone(client, requests)
        assert together(client, requests) == expected
        with server.http() as http:
            assert http.get("/props").json()["batched_decode"] is batched
    finally:
        server.stop()
