"""LoRA adapters on llama.cpp (docs/lora.md): tiny random GGUF adapters over the default model,
chosen per request three ways, loaded and unloaded at run time, kept apart in the prefix cache
and the prompt cache, and every bad input a 400 (a 409 for an adapter in use)."""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from bench.lora_adapters import gguf_adapter

from mlxcel.weights import default_model_path
from tests.conftest import serving
from tests.server_process import MLXCEL, ServerProcess

pytestmark = pytest.mark.slow

PROMPT = "The history of the lighthouse keepers on the northern coast is long. " * 6


@pytest.fixture(scope="module")
def adapters(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two random adapters, one built for other shapes, one for another architecture."""
    folder = tmp_path_factory.mktemp("adapters")
    model = default_model_path()
    gguf_adapter(model, folder / "alpha.gguf", seed=1)
    gguf_adapter(model, folder / "beta.gguf", seed=2)
    gguf_adapter(model, folder / "wrong-shape.gguf", seed=3, wrong_shape=True)
    gguf_adapter(model, folder / "other-arch.gguf", seed=4, architecture="qwen2")
    return folder


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, adapters: Path) -> Iterator[ServerProcess]:
    yield from serving(
        tmp_path_factory,
        "lora",
        "--lora",
        str(adapters / "alpha.gguf"),
        "--lora-scaled",
        f"{adapters / 'beta.gguf'}:1.0",
        "--lora-init-without-apply",
        "--parallel",
        "2",
        "--ctx-size",
        "2048",
        "--cache-ram",
        "64",
    )


@pytest.fixture(scope="module")
def http(server: ServerProcess) -> Iterator[httpx.Client]:
    with server.http() as client:
        yield client


def _run(http: httpx.Client, prompt: str = PROMPT, n: int = 16, **body: Any) -> dict[str, Any]:
    """A greedy /completion with each token's log-probability."""
    request = {"prompt": prompt, "n_predict": n, "temperature": 0, "n_probs": 1, **body}
    response = http.post("/completion", json=request)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def _tokens(answer: dict[str, Any]) -> list[tuple[int, float]]:
    """(token id, log-probability) of each generated token."""
    return [(p["id"], p["logprob"]) for p in answer["completion_probabilities"]]


def test_adapter_changes_output_and_the_base_is_exact(http: httpx.Client) -> None:
    base = _tokens(_run(http, cache_prompt=False))
    alpha = _tokens(_run(http, cache_prompt=False, lora=[{"id": 0, "scale": 1.0}]))
    beta = _tokens(_run(http, cache_prompt=False, lora=[{"id": 1, "scale": 1.0}]))
    assert abs(alpha[0][1] - base[0][1]) > 1e-3 and abs(beta[0][1] - base[0][1]) > 1e-3
    assert alpha != base and beta != base and alpha != beta
    # llama-server's generation_settings.lora: every adapter, at the scale the request ran it.
    settings = _run(http, n=1, lora=[{"id": 1, "scale": 0.5}])["generation_settings"]
    assert settings["lora"] == [{"id": 0, "scale": 0.0}, {"id": 1, "scale": 0.5}]
    # An empty list is the base model (llama-server's #28674 is that it is not there), and so
    # is every adapter at scale 0; without `lora` the global scales (0 here) apply.
    assert _tokens(_run(http, cache_prompt=False, lora=[])) == base
    zero = [{"id": 0, "scale": 0.0}, {"id": 1, "scale": 0}]
    assert _tokens(_run(http, cache_prompt=False, lora=zero)) == base


def test_global_scales_apply_to_requests_that_choose_none(http: httpx.Client) -> None:
    alpha = _tokens(_run(http, cache_prompt=False, lora=[{"id": 0, "scale": 1.0}]))
    assert http.post("/lora-adapters", json=[{"id": 0, "scale": 1.0}]).json() == {"success": True}
    try:
        listed = http.get("/lora-adapters").json()
        assert [(a["id"], a["name"], a["scale"]) for a in listed] == [
            (0, "alpha", 1.0),
            (1, "beta", 0.0),
        ]
        assert _tokens(_run(http, cache_prompt=False)) == alpha
        # A request's own list still wins: [] is the base, whatever the global scales.
        assert _tokens(_run(http, cache_prompt=False, lora=[])) != alpha
    finally:
        http.post("/lora-adapters", json=[])
    assert all(a["scale"] == 0.0 for a in http.get("/lora-adapters").json())


def test_adapter_listed_and_chosen_by_model(server: ServerProcess, http: httpx.Client) -> None:
    models = http.get("/v1/models").json()["data"]
    base_name = models[0]["id"]
    listed = {m["id"]: m.get("parent") for m in models}
    assert listed["alpha"] == base_name and listed["beta"] == base_name
    chosen = _tokens(_run(http, cache_prompt=False, lora=[{"id": 1, "scale": 1.0}]))
    assert _tokens(_run(http, cache_prompt=False, model="beta")) == chosen
    assert _tokens(_run(http, cache_prompt=False, model=f"{base_name}:beta")) == chosen
    # Through the OpenAI client too: the adapter's name is a model id.
    client = server.openai()
    answer = client.completions.create(model="beta", prompt=PROMPT, max_tokens=16, temperature=0)
    text = _run(http, cache_prompt=False, lora=[{"id": 1, "scale": 1.0}])["content"]
    assert answer.choices[0].text == text


def test_loaded_at_run_time_equals_loaded_at_start(adapters: Path, http: httpx.Client) -> None:
    at_start = _tokens(_run(http, cache_prompt=False, model="alpha"))
    body = {"lora_name": "alpha-again", "lora_path": str(adapters / "alpha.gguf")}
    response = http.post("/v1/load_lora_adapter", json=body)
    assert response.status_code == 200, response.text
    try:
        assert _tokens(_run(http, cache_prompt=False, model="alpha-again")) == at_start
        ids = {a["name"]: a["id"] for a in http.get("/lora-adapters").json()}
        lora = [{"id": ids["alpha-again"], "scale": 1.0}]
        assert _tokens(_run(http, cache_prompt=False, lora=lora)) == at_start
    finally:
        gone = http.post("/v1/unload_lora_adapter", json={"lora_name": "alpha-again"})
        assert gone.status_code == 200, gone.text
    assert "alpha-again" not in {m["id"] for m in http.get("/v1/models").json()["data"]}


def test_concurrent_requests_with_different_adapters_equal_their_solo_runs(
    http: httpx.Client,
) -> None:
    choices: list[list[dict[str, Any]]] = [[{"id": 0, "scale": 1.0}], [{"id": 1, "scale": 0.7}]]
    prompts = [PROMPT, "A short note about rivers and the sea. " * 5]
    solo = [
        _tokens(_run(http, p, n=24, cache_prompt=False, lora=c))
        for p, c in zip(prompts, choices, strict=True)
    ]
    together: list[Any] = [None, None]

    def run(i: int) -> None:
        together[i] = _tokens(_run(http, prompts[i], n=24, cache_prompt=False, lora=choices[i]))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert together == solo


def test_prefix_cache_never_serves_one_adapters_kv_to_another(http: httpx.Client) -> None:
    """Slot 0 holds the prompt's KV computed with alpha: the base model's request for the same
    prompt in the same slot shares none of it (else its log-probabilities would be alpha's
    context's), and neither does the prompt cache once the state is saved there."""
    reference = _tokens(_run(http, id_slot=1, cache_prompt=False))
    _run(http, id_slot=0, lora=[{"id": 0, "scale": 1.0}])
    after = _run(http, id_slot=0)
    assert after["timings"]["cache_n"] == 0
    assert _tokens(after) == reference
    # The same prompt run with alpha again reuses its own KV.
    _run(http, id_slot=0, lora=[{"id": 0, "scale": 1.0}])
    again = _run(http, id_slot=0, lora=[{"id": 0, "scale": 1.0}])
    assert again["timings"]["cache_n"] > 0
    # Alpha's state for another prompt goes to the prompt cache when a third prompt takes
    # slot 0; the base model's request for that prompt must not load it back.
    other = "A long letter about gardens, hedges and the old orchard wall. " * 6
    other_reference = _tokens(_run(http, other, id_slot=1, cache_prompt=False))
    _run(http, other, id_slot=0, lora=[{"id": 0, "scale": 1.0}])
    _run(http, "Something else entirely, about the weather. " * 6, id_slot=0, lora=[])
    from_cache = _run(http, other, id_slot=0)
    assert from_cache["timings"]["cache_n"] == 0
    assert _tokens(from_cache) == other_reference


def _error(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error: dict[str, Any] = response.json()["error"]
    return error


def test_bad_adapter_requests(adapters: Path, http: httpx.Client) -> None:
    unknown = http.post("/completion", json={"prompt": "x", "lora": [{"id": 9, "scale": 1}]})
    assert _error(unknown, 400)["param"] == "lora[0].id"
    infinite = http.post(
        "/completion",
        content=b'{"prompt": "x", "lora": [{"id": 0, "scale": 1e999}]}',
        headers={"content-type": "application/json"},
    )
    assert _error(infinite, 400)["param"] == "lora[0].scale"
    chat = http.post(
        "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "hi"}], "lora": [{"id": -1, "scale": 1}]},
    )
    assert _error(chat, 400)["param"] == "lora[0].id"
    assert _error(http.post("/lora-adapters", json=[{"id": 7, "scale": 1}]), 400)["param"]
    for name, why in (("wrong-shape", "incorrect shape"), ("other-arch", "arch mismatch")):
        body = {"lora_name": name, "lora_path": str(adapters / f"{name}.gguf")}
        error = _error(http.post("/v1/load_lora_adapter", json=body), 400)
        assert why in error["message"] and error["param"] == "lora_path"
    missing = {"lora_name": "missing", "lora_path": str(adapters / "missing.gguf")}
    assert _error(http.post("/v1/load_lora_adapter", json=missing), 400)["param"] == "lora_path"
    taken = {"lora_name": "alpha", "lora_path": str(adapters / "beta.gguf")}
    assert _error(http.post("/v1/load_lora_adapter", json=taken), 400)["param"] == "lora_name"
    gone = http.post("/v1/unload_lora_adapter", json={"lora_name": "nothing"})
    assert _error(gone, 400)["param"] == "lora_name"
    base_name = http.get("/v1/models").json()["data"][0]["id"]
    no_adapter = http.post("/completion", json={"prompt": "x", "model": f"{base_name}:nothing"})
    assert _error(no_adapter, 400)["param"] == "model"
    names = {a["name"] for a in http.get("/lora-adapters").json()}
    assert names == {"alpha", "beta"}


def test_unloading_an_adapter_in_use_is_a_409(adapters: Path, server: ServerProcess) -> None:
    body = {"lora_name": "busy", "lora_path": str(adapters / "beta.gguf")}
    with server.http() as http:
        assert http.post("/v1/load_lora_adapter", json=body).status_code == 200
        request = {"prompt": PROMPT, "n_predict": 400, "ignore_eos": True, "model": "busy"}
        request["stream"] = True
        with http.stream("POST", "/completion", json=request) as streamed:
            # Held while the unload is asked: a dropped line iterator closes the stream (its
            # generators end), and the request with it.
            lines = streamed.iter_lines()
            next(lines)  # generating
            busy = http.post("/v1/unload_lora_adapter", json={"lora_name": "busy"})
            assert _error(busy, 409)["code"] == "adapter_in_use"
            lines.close()
        # The stream is closed: its request ends, and the adapter may go.
        for _ in range(50):
            done = http.post("/v1/unload_lora_adapter", json={"lora_name": "busy"})
            if done.status_code != 409:
                break
        assert done.status_code == 200, done.text


def test_an_adapter_that_does_not_fit_stops_the_start(adapters: Path) -> None:
    command = [MLXCEL, "serve", "--threads", "1", "--lora", str(adapters / "wrong-shape.gguf")]
    ended = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert ended.returncode != 0
    assert "wrong-shape" in ended.stderr and "incorrect shape" in ended.stderr
    missing = [MLXCEL, "serve", "--lora-scaled", f"{adapters / 'alpha.gguf'}:inf"]
    ended = subprocess.run(missing, capture_output=True, text=True, timeout=60)
    assert ended.returncode == 2 and "not a finite number" in ended.stderr


def test_echo_scores_a_prompt_with_the_requests_adapter(http: httpx.Client) -> None:
    lora = [{"id": 0, "scale": 1.0}]
    # Short: prompt and answer are scored in one batch of the size a short prompt is evaluated
    # in (llama.cpp's CPU kernels differ from 64 rows on: backends/llamacpp/scoring.py).
    short = "The lighthouse keepers of the north."
    alpha = _tokens(_run(http, prompt=short, cache_prompt=False, lora=lora))
    prompt = http.post("/tokenize", json={"content": short}).json()["tokens"]

    def scored(**body: Any) -> list[float]:
        request = {"prompt": prompt + [t for t, _ in alpha], "max_tokens": 0, "logprobs": 1}
        response = http.post("/v1/completions", json={**request, "echo": True, **body})
        assert response.status_code == 200, response.text
        scores: list[float] = response.json()["choices"][0]["logprobs"]["token_logprobs"]
        return scores[len(prompt) :]

    # Scored with the adapter, as it generated them; not as the base scores them. Not to the
    # last bit: with an adapter, llama.cpp's results depend on how rows are batched, and this
    # random adapter turns those differences into up to 0.07 nats by the answer's end.
    alphas = [lp for _, lp in alpha]
    with_adapter, without = scored(lora=lora), scored()
    near = sum(abs(a - b) for a, b in zip(with_adapter, alphas, strict=True)) / len(alpha)
    base = sum(abs(a - b) for a, b in zip(without, alphas, strict=True)) / len(alpha)
    assert abs(with_adapter[0] - alphas[0]) < 0.1 and near < 0.1 and base > 4 * near
