"""KV cache data types: -ctk/-ctv and kv_bits, the cache's size in /props, bad values refused."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from mlxcel.backends.llamacpp.kv_cache import KV_TYPES
from mlxcel.config.settings import KV_CACHE_TYPES
from tests._client_util import default_gguf
from tests.conftest import serving
from tests.server_process import ServerProcess
from tests.test_models import _refused

CTX = "2048"
GREEDY = {"max_tokens": 12, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def q8(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    yield from serving(tmp_path_factory, "q8", "--ctx-size", CTX, "-ctk", "q8_0", "-ctv", "q8_0")


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    # Also a prompt thread count of its own (-tb), as llama-server takes it.
    yield from serving(
        tmp_path_factory, "mixed", "--ctx-size", CTX, "--cache-type-k", "q4_0", "-tb", "1"
    )


def _kv_cache(server: ServerProcess) -> dict[str, int | str]:
    with server.http() as http:
        cache: dict[str, int | str] = http.get("/props").json()["kv_cache"]
    return cache


def test_the_cli_and_the_backend_know_the_same_cache_types() -> None:
    assert set(KV_CACHE_TYPES) == set(KV_TYPES)


def test_q8_0_serves_with_a_smaller_cache_than_f16(
    server: ServerProcess, q8: ServerProcess
) -> None:
    f16, q8_0 = _kv_cache(server), _kv_cache(q8)
    assert (f16["type_k"], f16["type_v"]) == ("f16", "f16")
    assert (q8_0["type_k"], q8_0["type_v"]) == ("q8_0", "q8_0")
    assert f16["n_cells"] == q8_0["n_cells"]
    # q8_0 stores 32 values in 34 bytes, f16 in 64.
    assert q8_0["bytes"] * 64 == f16["bytes"] * 34
    assert q8_0["bytes"] == q8_0["k_bytes"] + q8_0["v_bytes"]  # type: ignore[operator]
    client = q8.openai()
    first = client.completions.create(model="default", prompt="The sea is", extra_body=GREEDY)
    again = client.completions.create(model="default", prompt="The sea is", extra_body=GREEDY)
    assert first.usage is not None and first.usage.completion_tokens == 12
    assert first.choices[0].text == again.choices[0].text


def test_k_and_v_types_are_set_apart(server: ServerProcess, mixed: ServerProcess) -> None:
    f16, cache = _kv_cache(server), _kv_cache(mixed)
    assert (cache["type_k"], cache["type_v"]) == ("q4_0", "f16")
    assert cache["v_bytes"] == f16["v_bytes"]
    # q4_0: 32 values in 18 bytes.
    assert cache["k_bytes"] * 64 == f16["k_bytes"] * 18  # type: ignore[operator]
    reply = mixed.openai().completions.create(model="default", prompt="Hi", extra_body=GREEDY)
    assert reply.usage is not None and reply.usage.completion_tokens == 12


def test_bad_cache_types_are_refused_before_loading(tmp_path: Path) -> None:
    assert "invalid choice: 'q3_k'" in _refused(tmp_path, "-ctk", "q3_k")
    assert _refused(tmp_path, "-tb", "0").endswith("--threads-batch must be at least 1")
    assert _refused(tmp_path, "-ctv", "q4_0", "-fa", "off").endswith(
        "--cache-type-v q4_0 needs flash attention: use --flash-attn on or auto, or an f16 V cache"
    )
    gguf = default_gguf()
    cases = {
        "bits.yaml": (
            f"models:\n  - model_path: {gguf}\n    kv_bits: 3\n",
            "{file}:3: models[0].kv_bits: llama.cpp has KV cache types of 4, 5, 8 bits, not 3",
        ),
        "both.yaml": (
            f"models:\n  - model_path: {gguf}\n    cache_type_k: q8_0\n    kv_bits: 4\n",
            "{file}:4: models[0].kv_bits sets what cache_type_k already set",
        ),
        "type.yaml": (
            f"models:\n  - model_path: {gguf}\n    cache_type_v: q2\n",
            "{file}:3: models[0].cache_type_v: expected one of "
            f"{', '.join(KV_CACHE_TYPES)}, got 'q2'",
        ),
        "fa.yaml": (
            f"models:\n  - model_path: {gguf}\n    flash_attn: off\n    kv_bits: 8\n",
            "{file}:4: models[0]: --cache-type-v q8_0 needs flash attention: use --flash-attn "
            "on or auto, or an f16 V cache",
        ),
    }
    for name, (text, expected) in cases.items():
        path = tmp_path / name
        path.write_text(text)
        assert _refused(tmp_path, "--config", str(path)).endswith(expected.format(file=path))
