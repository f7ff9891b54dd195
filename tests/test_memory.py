"""--max-memory: measured model sizes (each worker process's resident memory), LRU eviction of
idle models, never a busy one, 503 when there is no room; and unloading gives the memory back
(the server's and its workers' resident memory together)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests._client_util import default_gguf
from tests.conftest import start
from tests.server_process import ServerProcess

pytestmark = pytest.mark.slow

HELLO = [{"role": "user", "content": "Say hello."}]
# Long enough to still be running while the test looks.
LONG: dict[str, Any] = {"max_tokens": 200, "extra_body": {"ignore_eos": True}}


def _models(names: list[str], **keys: object) -> str:
    extra = "".join(f"    {k}: {v}\n" for k, v in keys.items())
    gguf = default_gguf()
    return "models:\n" + "".join(
        f"  - model_path: {gguf}\n    name: {name}\n    ctx_size: 512\n{extra}" for name in names
    )


def _states(server: ServerProcess) -> dict[str, str]:
    with server.http() as http:
        return {m["id"]: m["state"] for m in http.get("/v1/models").json()["data"]}


def _sizes(server: ServerProcess) -> dict[str, int]:
    with server.http() as http:
        return {m["id"]: m["meta"]["memory_bytes"] for m in http.get("/v1/models").json()["data"]}


@pytest.fixture(scope="module")
def model_size(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """What one worker serving the default model measures, on this machine."""
    tmp = tmp_path_factory.mktemp("size")
    config = tmp / "m.yaml"
    config.write_text(_models(["m"]))
    proc = start(tmp, "--config", str(config))
    try:
        yield _sizes(proc)["m"]
    finally:
        proc.stop()


def test_budget_evicts_the_least_recently_used_idle_model_never_a_busy_one(
    tmp_path: Path, model_size: int
) -> None:
    # Room for two models, not three.
    budget = int(model_size * 2.5)
    config = tmp_path / "m.yaml"
    config.write_text(_models(["a", "b", "c"], on_demand="true"))
    proc = start(tmp_path, "--config", str(config), "--max-memory", str(budget))
    try:
        client = proc.openai()
        for name in ("a", "b", "a"):
            client.chat.completions.create(model=name, messages=HELLO, max_tokens=2)
        client.chat.completions.create(model="c", messages=HELLO, max_tokens=2)
        assert _states(proc) == {"a": "loaded", "b": "unloaded", "c": "loaded"}
        assert "unloaded model 'b' (making room for 'c')" in proc.log()
        sizes = _sizes(proc)
        assert sizes["a"] > 0 and sizes["b"] > 0 and sizes["c"] > 0

        # With a and c both busy, b finds no room: 503 naming who holds the memory.
        streams = [
            client.chat.completions.create(model=name, messages=HELLO, stream=True, **LONG)
            for name in ("a", "c")
        ]
        for stream in streams:
            next(iter(stream))
        with pytest.raises(openai.InternalServerError) as caught:
            client.chat.completions.create(model="b", messages=HELLO, max_tokens=2)
        assert caught.value.status_code == 503
        message = str(caught.value.body["message"])  # type: ignore[index]
        assert message.startswith("not enough memory for the model 'b': it needs about")
        assert "'a'" in message and "'c'" in message and "1 request(s)" in message
        # Neither busy model was touched: both streams run to their end.
        for stream in streams:
            finishes = [c.choices[0].finish_reason for c in stream if c.choices]
            assert finishes[-1] == "length"
        assert _states(proc) == {"a": "loaded", "b": "unloaded", "c": "loaded"}
    finally:
        proc.stop()


def test_a_model_past_the_whole_budget_never_stays_nor_evicts(
    tmp_path: Path, model_size: int
) -> None:
    """Sized from its file for its first load, a model whose worker holds more than the whole
    budget was loaded anyway (235 MiB under 150 MiB); once its size was known it still evicted
    every idle model before its 503. Measured past the budget, it is unloaded with a 503
    saying so; after that it is refused at once and the others stay."""
    budget = (default_gguf().stat().st_size + model_size) // 2
    config = tmp_path / "m.yaml"
    config.write_text(_models(["big"], on_demand="true"))
    proc = start(tmp_path, "--config", str(config), "--max-memory", str(budget))
    try:
        client = proc.openai()
        for _ in range(2):
            with pytest.raises(openai.InternalServerError) as caught:
                client.completions.create(model="big", prompt="Hi", max_tokens=2)
            assert caught.value.status_code == 503
            assert "more than the whole --max-memory" in str(caught.value.body)
            assert _states(proc) == {"big": "unloaded"}
            assert not proc.workers()
        # The second time its measured size refused it before any load.
        assert proc.log().count("loading model 'big'") == 1
    finally:
        proc.stop()


def test_a_first_load_measured_past_the_budget_beside_the_others_does_not_stay(
    tmp_path: Path, model_size: int
) -> None:
    """Sized from its file (less than its worker holds), a model's first load fit beside a
    pinned one; measured, the two were past the budget, and both stayed. Now the new one is
    unloaded with a 503 naming who holds the memory."""
    gguf = default_gguf()
    copy = tmp_path / "copy.gguf"
    copy.write_bytes(gguf.read_bytes())
    # Room for one measured worker and the other's file, not for two workers.
    budget = model_size + (gguf.stat().st_size + model_size) // 2
    assert model_size + gguf.stat().st_size < budget < 2 * model_size
    config = tmp_path / "m.yaml"
    config.write_text(
        f"server:\n  max_memory: {budget}\nmodels:\n"
        f"  - model_path: {gguf}\n    name: kept\n    pinned: true\n    ctx_size: 512\n"
        f"  - model_path: {copy}\n    name: other\n    on_demand: true\n    ctx_size: 512\n"
    )
    proc = start(tmp_path, "--config", str(config))
    try:
        for _ in range(2):
            with pytest.raises(openai.InternalServerError) as caught:
                proc.openai().completions.create(model="other", prompt="Hi", max_tokens=2)
            assert caught.value.status_code == 503
            message = str(caught.value.body)
            assert "not enough memory for the model 'other'" in message
            assert "'kept'" in message and "(pinned)" in message
            assert _states(proc) == {"kept": "loaded", "other": "unloaded"}
            assert len(proc.workers()) == 1
        # Its measured size refused it the second time before any load.
        assert proc.log().count("loading model 'other'") == 1
    finally:
        proc.stop()


def test_pinned_model_is_never_evicted(tmp_path: Path, model_size: int) -> None:
    budget = int(model_size * 1.5)
    config = tmp_path / "m.yaml"
    gguf = default_gguf()
    config.write_text(
        f"server:\n  max_memory: {budget}\nmodels:\n"
        f"  - model_path: {gguf}\n    name: kept\n    pinned: true\n    ctx_size: 512\n"
        f"  - model_path: {gguf}\n    name: other\n    on_demand: true\n    ctx_size: 512\n"
    )
    proc = start(tmp_path, "--config", str(config))
    try:
        with pytest.raises(openai.InternalServerError) as caught:
            proc.openai().completions.create(model="other", prompt="Hi", max_tokens=2)
        assert "'kept'" in str(caught.value.body) and "(pinned)" in str(caught.value.body)
        assert _states(proc) == {"kept": "loaded", "other": "unloaded"}
    finally:
        proc.stop()


def test_unloading_gives_the_memory_back(tmp_path: Path) -> None:
    config = tmp_path / "m.yaml"
    config.write_text(_models(["m"], on_demand="true"))
    proc = start(tmp_path, "--config", str(config))
    try:
        with proc.http() as http:
            baseline = proc.resident_bytes() // 1024
            assert http.post("/models/load", json={"model": "m"}).is_success
            assert len(proc.workers()) == 1
            loaded = proc.resident_bytes() // 1024
            assert http.post("/models/unload", json={"model": "m"}).is_success
            # Unloading ends the worker process: its memory is the system's again.
            assert proc.workers() == []
            after = proc.resident_bytes() // 1024
        weights_kib = default_gguf().stat().st_size // 1024
        assert loaded - baseline > weights_kib
        assert after - baseline < (loaded - baseline) // 10
    finally:
        proc.stop()


def test_bad_max_memory_is_refused(tmp_path: Path) -> None:
    import subprocess

    from tests.server_process import MLXCEL

    result = subprocess.run(
        [MLXCEL, "serve", "--max-memory", "lots"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        "mlxcel serve: error: argument --max-memory: 'lots' is not a size: use bytes, 512M, 8G "
        "or a percentage like 50%"
    )
