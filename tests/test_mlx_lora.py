"""LoRA adapters on MLX (docs/lora.md): mlx-lm and PEFT adapter folders over the tests' tiny
Llama, chosen per request, loaded at run time, and equal to mlx-lm's own generate with the
adapter path."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from bench.lora_adapters import mlx_adapter

from tests.conftest import LLAMA_DIR, serving
from tests.server_process import ServerProcess

pytest.importorskip("mlx_lm")
pytestmark = pytest.mark.slow

PROMPT = "the cat sat on the table and the dog ran to the river when the king"


@pytest.fixture(scope="module")
def adapters(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("mlx-adapters")
    mlx_adapter(folder / "cat", seed=1)
    mlx_adapter(folder / "dog", seed=2)
    mlx_adapter(folder / "cat-peft", seed=1, peft=True)
    mlx_adapter(folder / "wrong", seed=3, wrong_shape=True)
    return folder


@pytest.fixture(scope="module")
def server(
    models: Path, adapters: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    yield from serving(
        tmp_path_factory,
        "mlx-lora",
        *("-m", str(models / LLAMA_DIR), "--backend", "mlx", "--parallel", "2", "-c", "1024"),
        *("--lora", str(adapters / "cat"), "--lora-scaled", f"{adapters / 'dog'}:0.5"),
        "--lora-init-without-apply",
    )


@pytest.fixture(scope="module")
def http(server: ServerProcess) -> Iterator[httpx.Client]:
    with server.http() as client:
        yield client


def _ids(http: httpx.Client, text: str = PROMPT) -> list[int]:
    tokens: list[int] = http.post("/tokenize", json={"content": text}).json()["tokens"]
    return tokens


def _run(http: httpx.Client, prompt: Any, n: int = 12, **body: Any) -> list[tuple[int, float]]:
    """Greedy tokens and their log-probabilities, to the limit."""
    request = {"prompt": prompt, "n_predict": n, "temperature": 0, "n_probs": 1, **body}
    response = http.post("/completion", json={"ignore_eos": True, **request})
    assert response.status_code == 200, response.text
    return [(p["id"], p["logprob"]) for p in response.json()["completion_probabilities"]]


def test_adapter_changes_output_and_the_base_is_exact(http: httpx.Client) -> None:
    prompt = _ids(http)
    base = _run(http, prompt, cache_prompt=False)
    cat = _run(http, prompt, cache_prompt=False, lora=[{"id": 0, "scale": 1.0}])
    assert [t for t, _ in cat] != [t for t, _ in base]
    assert _run(http, prompt, cache_prompt=False, lora=[]) == base
    assert _run(http, prompt, cache_prompt=False, lora=[{"id": 0, "scale": 0}]) == base
    assert _run(http, prompt, cache_prompt=False, model="cat") == cat


def test_greedy_output_equals_mlx_lm_generate_with_the_adapter(
    models: Path, adapters: Path, http: httpx.Client
) -> None:
    from mlx_lm import load, stream_generate
    from mlx_lm.sample_utils import make_sampler

    prompt = _ids(http)
    ours = [t for t, _ in _run(http, prompt, n=16, cache_prompt=False, model="cat")]
    model, tokenizer = load(str(models / LLAMA_DIR), adapter_path=str(adapters / "cat"))
    theirs = [
        r.token
        for r in stream_generate(
            model, tokenizer, prompt, max_tokens=16, sampler=make_sampler(temp=0.0)
        )
    ]
    assert ours == theirs[: len(ours)] and len(ours) == 16


def test_peft_folder_and_run_time_load_equal_the_adapter_at_start(
    adapters: Path, http: httpx.Client
) -> None:
    prompt = _ids(http)
    at_start = _run(http, prompt, cache_prompt=False, model="cat")
    for name in ("cat-again", "cat-peft"):
        folder = adapters / ("cat" if name == "cat-again" else name)
        body = {"lora_name": name, "lora_path": str(folder)}
        response = http.post("/v1/load_lora_adapter", json=body)
        assert response.status_code == 200, response.text
        assert _run(http, prompt, cache_prompt=False, model=name) == at_start
        assert http.post("/v1/unload_lora_adapter", json={"lora_name": name}).status_code == 200


def test_concurrent_requests_with_different_adapters_equal_their_solo_runs(
    http: httpx.Client,
) -> None:
    prompts = [_ids(http), _ids(http, "a small red bird flew over the old house and")]
    choices = [[{"id": 0, "scale": 1.0}], [{"id": 1, "scale": 1.0}]]
    solo = [_run(http, p, n=16, lora=c) for p, c in zip(prompts, choices, strict=True)]
    together: list[Any] = [None, None]

    def run(i: int) -> None:
        together[i] = _run(http, prompts[i], n=16, cache_prompt=False, lora=choices[i])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert together == solo


def test_an_adapter_for_other_shapes_is_a_400(adapters: Path, http: httpx.Client) -> None:
    body = {"lora_name": "wrong", "lora_path": str(adapters / "wrong")}
    response = http.post("/v1/load_lora_adapter", json=body)
    assert response.status_code == 400, response.text
    assert "another model" in response.json()["error"]["message"]
    not_a_folder = {"lora_name": "none", "lora_path": str(adapters)}
    assert http.post("/v1/load_lora_adapter", json=not_a_folder).status_code == 400
