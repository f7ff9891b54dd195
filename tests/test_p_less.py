"""p-less sampling (arXiv 2509.23234): its threshold on hand-made distributions, then over HTTP.

The threshold is sum(p**2) of the distribution the draw would use; p-less-norm lowers it to
(V * sum(p**2) - 1) / (V - 1). The HTTP tests run both engines on random-weight models, whose
own next-token distribution is nearly flat: a logit_bias of about ln(V) makes one token more
likely than all the others together, and without one thousands of tokens stay in the running.
"""

from __future__ import annotations

import ctypes
import json
import math
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np
import openai
import pytest
from bench.models import SHAPES, tiny

import mlxcel
from mlxcel.backends.llamacpp.sampling import p_less_keep, p_less_sampler
from tests.conftest import LLAMA_DIR, start
from tests.server_process import MLXCEL, ServerProcess

TINY_LLAMA = tiny(SHAPES["smollm2-135m"])

# (probabilities, kept by p-less, kept by p-less-norm), worked out by hand:
CASES = [
    # sum p^2 = .25 + .09 + .04 = .38; norm (3 * .38 - 1) / 2 = .07
    ([0.5, 0.3, 0.2], {0}, {0, 1, 2}),
    # .16 + .1225 + .0225 + .01 = .315; norm (4 * .315 - 1) / 3 = .0867
    ([0.4, 0.35, 0.15, 0.1], {0, 1}, {0, 1, 2, 3}),
    # .2025 + .09 + .0256 + .0025 + .0016 = .3222; norm (5 * .3222 - 1) / 4 = .1528
    ([0.45, 0.3, 0.16, 0.05, 0.04], {0}, {0, 1, 2}),
    # .81 + .0025 + .0009 + .0004 = .8138; norm (4 * .8138 - 1) / 3 = .7517
    ([0.9, 0.05, 0.03, 0.02], {0}, {0}),
    # uniform: sum p^2 = p, every token ties with the threshold and stays; norm 0
    ([0.25, 0.25, 0.25, 0.25], {0, 1, 2, 3}, {0, 1, 2, 3}),
    # a masked token is no candidate: V = 3, .25 + .1444 + .0144 = .4088, norm .1132
    # (with V = 4 the norm threshold would be .2117 and drop token 2)
    ([0.5, 0.38, 0.12, 0.0], {0}, {0, 1, 2}),
]


def paper_threshold(probs: np.ndarray, *, norm: bool) -> float:
    """The paper's threshold, written out: sum p^2, or (V sum p^2 - 1) / (V - 1)."""
    collision = float(np.sum(probs * probs))
    v = int(np.count_nonzero(probs))
    return (v * collision - 1) / (v - 1) if norm else collision


def logits_of(probs: list[float]) -> np.ndarray:
    p = np.asarray(probs, dtype=np.float64)
    return np.where(p > 0, np.log(np.where(p > 0, p, 1)), -np.inf).astype(np.float32)


def llama_kept(logits: np.ndarray, temperature: float, *, norm: bool) -> list[int]:
    """What a temperature sampler then our p-less sampler leave, in a real llama.cpp chain."""
    data = (llama_cpp.llama_token_data * len(logits))(
        *(llama_cpp.llama_token_data(i, float(x), 0.0) for i, x in enumerate(logits))
    )
    array = llama_cpp.llama_token_data_array(
        ctypes.cast(data, ctypes.POINTER(llama_cpp.llama_token_data)), len(logits), -1, False
    )
    chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_temp(temperature))
    llama_cpp.llama_sampler_chain_add(chain, p_less_sampler(norm=norm))
    llama_cpp.llama_sampler_apply(chain, ctypes.byref(array))
    llama_cpp.llama_sampler_free(chain)
    return [data[i].id for i in range(array.size)]


def mlx_kept(logits: np.ndarray, temperature: float, *, norm: bool) -> set[int]:
    mx = pytest.importorskip("mlx.core")
    from mlxcel.backends.mlx.sampling import p_less

    out = np.array(p_less(mx.array(logits)[None] * (1 / temperature), norm=norm)[0])
    return set(np.flatnonzero(np.isfinite(out)).tolist())


@pytest.mark.parametrize(("probs", "plain", "norm"), CASES)
def test_threshold_on_hand_made_distributions(
    probs: list[float], plain: set[int], norm: set[int]
) -> None:
    p = np.asarray(probs)
    for variant, expected in ((False, plain), (True, norm)):
        threshold = paper_threshold(p, norm=variant)
        assert {i for i, x in enumerate(probs) if x > 0 and x >= threshold - 1e-12} == expected
        logits = logits_of(probs)
        assert set(np.flatnonzero(p_less_keep(logits, norm=variant)).tolist()) == expected
        assert llama_kept(logits, 1.0, norm=variant) == sorted(expected)
        assert mlx_kept(logits, 1.0, norm=variant) == expected


@pytest.mark.parametrize("temperature", [0.3, 1.0, 2.5])
def test_threshold_follows_temperature_on_random_distributions(temperature: float) -> None:
    rng = np.random.default_rng(7)
    for size in (2, 10, 200, 5000):
        logits = (rng.standard_normal(size) * 3).astype(np.float32)
        scaled = logits.astype(np.float64) / temperature
        probs = np.exp(scaled - scaled.max())
        probs /= probs.sum()
        for norm in (False, True):
            expected = set(np.flatnonzero(probs >= paper_threshold(probs, norm=norm)).tolist())
            assert expected, "the most likely token always passes"
            assert set(llama_kept(logits, temperature, norm=norm)) == expected
            assert mlx_kept(logits, temperature, norm=norm) == expected


# Over HTTP on both engines.


@dataclass
class Engine:
    server: ServerProcess
    n_vocab: int

    def token(self, text: str) -> int:
        with self.server.http() as http:
            return int(http.post("/tokenize", json={"content": text}).json()["tokens"][-1])

    def bias(self, text: str) -> dict[str, float]:
        """A bias that makes `text`'s token about 4.5 times as likely as all others together
        at temperature 2 (p ~ 0.82), far below "always" (100)."""
        return {str(self.token(text)): 2 * (math.log(self.n_vocab) + 1.5)}


@pytest.fixture(scope="module", params=["llamacpp", "mlx"])
def engine(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Engine]:
    tmp = tmp_path_factory.mktemp(request.param)
    if request.param == "mlx":
        pytest.importorskip("mlx_lm")
        model: Path = request.getfixturevalue("models") / LLAMA_DIR
        n_vocab = int(json.loads((model / "config.json").read_text())["vocab_size"])
        args: tuple[str, ...] = ("-m", str(model), "--backend", "mlx")
    else:
        args = ("-m", str(request.getfixturevalue("tiny_gguf")))
        n_vocab = TINY_LLAMA.vocab
    proc = start(tmp, *args, "-c", "1024")
    yield Engine(proc, n_vocab)
    proc.stop_soon()


@pytest.fixture(scope="module")
def client(engine: Engine) -> openai.OpenAI:
    return engine.server.openai()


PROMPT = "Once upon a time"
# Every other truncation off, so a baseline without p-less sees the whole distribution.
WHOLE = {"top_k": 0, "top_p": 1.0, "min_p": 0.0, "ignore_eos": True}


def complete(client: openai.OpenAI, **body: Any) -> str:
    fields = {"temperature", "seed", "logit_bias", "max_tokens"}
    top = {k: v for k, v in body.items() if k in fields}
    extra = {**WHOLE, **{k: v for k, v in body.items() if k not in fields}}
    response = client.completions.create(
        model="default", prompt=PROMPT, **{"max_tokens": 12, **top}, extra_body=extra
    )
    return response.choices[0].text


@pytest.mark.slow
def test_an_overwhelming_bias_leaves_one_token_at_any_temperature(
    client: openai.OpenAI, engine: Engine
) -> None:
    bias = engine.bias(" cat")
    forced = complete(client, temperature=0, logit_bias=bias)
    for temperature in (0.7, 1.0, 2.0):
        for seed in (1, 2, 3):
            text = complete(
                client, temperature=temperature, seed=seed, logit_bias=bias, p_less=True
            )
            assert text == forced
    # The same request without p-less does sample the other tokens.
    plain = {complete(client, temperature=2.0, seed=seed, logit_bias=bias) for seed in (1, 2, 3)}
    assert plain != {forced}


@pytest.mark.slow
def test_a_flat_distribution_keeps_many_tokens(client: openai.OpenAI) -> None:
    for variant in ("p_less", "p_less_norm"):
        texts = [
            complete(client, temperature=1.0, seed=seed, **{variant: True}) for seed in range(4)
        ]
        assert len(set(texts)) > 1
        assert complete(client, temperature=1.0, seed=0, **{variant: True}) == texts[0]


@pytest.mark.slow
def test_with_top_k_min_p_and_a_grammar_only_allowed_tokens(client: openai.OpenAI) -> None:
    grammar = 'root ::= [ab]+ " " [0-9]+'
    for seed in (1, 2, 3):
        text = complete(
            client,
            temperature=2.0,
            seed=seed,
            p_less=True,
            top_k=4,
            min_p=0.2,
            grammar=grammar,
            max_tokens=8,
        )
        assert re.fullmatch(r"[ab]+( [0-9]*)?", text), text
    # top_k 1 leaves p-less one candidate: greedy, whatever the temperature.
    greedy = complete(client, temperature=0, grammar=grammar, max_tokens=8)
    for seed in (1, 2):
        one = complete(
            client, temperature=2.0, seed=seed, p_less=True, top_k=1, grammar=grammar, max_tokens=8
        )
        assert one == greedy


@pytest.mark.slow
def test_every_text_route_and_the_client_take_it(client: openai.OpenAI, engine: Engine) -> None:
    bias = engine.bias(" cat")
    extra = {**WHOLE, "logit_bias": bias}

    def chat(body: dict[str, Any]) -> str:
        messages = [{"role": "user", "content": "Tell me a story."}]
        response = client.chat.completions.create(
            model="default", messages=messages, max_tokens=8, extra_body=body
        )
        return str(response.choices[0].message.content)

    def respond(body: dict[str, Any]) -> str:
        response = client.responses.create(
            model="default", input="Tell me a story.", max_output_tokens=8, extra_body=body
        )
        return response.output_text

    def messages(body: dict[str, Any]) -> str:
        with engine.server.http() as http:
            reply = http.post(
                "/v1/messages",
                json={
                    "model": "default",
                    "max_tokens": 8,
                    "messages": [{"role": "user", "content": "Tell me a story."}],
                    **body,
                },
            )
        return "".join(block.get("text", "") for block in reply.json()["content"])

    def native(body: dict[str, Any]) -> str:
        with engine.server.http() as http:
            reply = http.post("/completion", json={"prompt": PROMPT, "n_predict": 8, **body})
        return str(reply.json()["content"])

    for run in (chat, respond, messages, native):
        greedy = run({**extra, "temperature": 0})
        sampled = {run({**extra, "temperature": 2.0, "seed": s, "p_less": True}) for s in (1, 2)}
        assert sampled == {greedy}, run.__name__

    forced = complete(client, temperature=0, logit_bias=bias)
    with mlxcel.LLM(base_url=engine.server.base_url) as llm:
        for seed in (1, 2):
            text = llm.generate(
                PROMPT,
                max_tokens=12,
                temperature=2.0,
                seed=seed,
                logit_bias=bias,
                p_less=True,
                **WHOLE,
            )
            assert text == forced


@pytest.mark.slow
def test_props_lists_it_and_both_at_once_is_a_400(engine: Engine) -> None:
    with engine.server.http() as http:
        params = http.get("/props").json()["default_generation_settings"]["params"]
        assert params["p_less"] is False and params["p_less_norm"] is False
        reply = http.post(
            "/v1/completions", json={"prompt": PROMPT, "p_less": True, "p_less_norm": True}
        )
    assert reply.status_code == 400
    assert reply.json()["error"]["param"] == "p_less_norm"


@pytest.mark.slow
def test_server_flag_sets_the_default(tmp_path: Path, tiny_gguf: Path) -> None:
    proc = start(tmp_path, "-m", str(tiny_gguf), "-c", "512", "--p-less")
    try:
        with proc.http() as http:
            params = http.get("/props").json()["default_generation_settings"]["params"]
        assert params["p_less"] is True and params["p_less_norm"] is False
        engine = Engine(proc, TINY_LLAMA.vocab)
        client = proc.openai()
        bias = engine.bias(" cat")
        forced = complete(client, temperature=0, logit_bias=bias)
        assert {complete(client, temperature=2.0, seed=s, logit_bias=bias) for s in (1, 2)} == {
            forced
        }
        off = {
            complete(client, temperature=2.0, seed=s, logit_bias=bias, p_less=False)
            for s in (1, 2, 3)
        }
        assert off != {forced}
    finally:
        proc.stop()
    both = subprocess.run(
        [MLXCEL, "serve", "--p-less", "--p-less-norm"], capture_output=True, text=True, timeout=60
    )
    assert both.returncode == 2
    assert "--p-less" in both.stderr
