"""Many models in one server: a YAML config, names and aliases, capabilities, on-demand loads,
unload and load routes, idle unload, mlx-openai-server's files and `launch` flags, bad
configs and their messages."""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from prometheus_client import CollectorRegistry

from mlxcel.config.settings import ModelConfig
from mlxcel.engine.metrics import EngineMetrics
from mlxcel.models.entry import MissingCapability, ModelNotFound
from mlxcel.models.registry import ModelRegistry
from tests._client_util import default_gguf
from tests.conftest import LLAMA_DIR, start
from tests.server_process import MLXCEL, ServerProcess

pytestmark = pytest.mark.slow

HELLO = [{"role": "user", "content": "Say hello."}]
GREEDY: dict[str, Any] = {"temperature": 0, "max_tokens": 6}


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _listed(server: ServerProcess) -> dict[str, dict[str, Any]]:
    with server.http() as client:
        response = client.get("/v1/models")
    assert response.status_code == 200
    return {entry["id"]: entry for entry in response.json()["data"]}


def _wait_state(server: ServerProcess, name: str, *states: str, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while (state := _listed(server)[name]["state"]) not in states:
        assert time.monotonic() < deadline, f"{name} still {state}, not {states}"
        time.sleep(0.02)
    return str(state)


@pytest.fixture(scope="module")
def multi(models: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("multi")
    gguf = default_gguf()
    config = _write(
        tmp / "models.yaml",
        f"""\
server:
  host: 127.0.0.1
  port: 1  # the test's --port wins
models:
  - model_path: {gguf}
    served_model_name: chat-a
    aliases: [a-alias, a2]
    context_length: 1024
  - model: {gguf}
    name: chat-b
    aliases: b-alias
    ctx_size: 1024
  - model_path: {models / LLAMA_DIR}
    served_model_name: tiny
    on_demand: true
    ctx_size: 512
""",
    )
    proc = start(tmp, "--config", str(config))
    yield proc
    proc.stop_soon()


def test_on_demand_model_loads_once_for_concurrent_first_requests(multi: ServerProcess) -> None:
    assert _listed(multi)["tiny"]["state"] == "unloaded"
    client = multi.openai()
    answers: list[str] = []

    def ask() -> None:
        reply = client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=3)
        answers.append(reply.model)

    threads = [threading.Thread(target=ask) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert answers == ["tiny"] * 4
    assert multi.log().count("loading model 'tiny'") == 1
    assert _listed(multi)["tiny"]["state"] == "loaded"


def test_startup_models_load_side_by_side(multi: ServerProcess) -> None:
    # Without a memory budget each startup model's worker starts at once: the second load
    # begins before the first has finished.
    log = multi.log()
    assert log.index("loading model 'chat-b'") < log.index("loaded model 'chat-a'")


def test_models_listed_with_aliases_capabilities_and_state(multi: ServerProcess) -> None:
    listed = multi.openai().models.list().data
    assert [m.id for m in listed] == ["chat-a", "chat-b", "tiny"]
    first = listed[0].model_extra or {}
    assert first["aliases"] == ["chat-a", "a-alias", "a2"]
    assert first["capabilities"] == ["text"]
    assert first["state"] == "loaded"
    assert first["meta"]["backend"] == "llama.cpp"
    assert (listed[2].model_extra or {})["meta"]["backend"] == "mlx"


def test_requests_routed_by_name_and_alias(multi: ServerProcess) -> None:
    client = multi.openai()
    routed = {
        name: client.chat.completions.create(model=name, messages=HELLO, **GREEDY)
        for name in ("chat-a", "a-alias", "a2", "chat-b", "b-alias", "default")
    }
    assert {name: r.model for name, r in routed.items()} == {
        "chat-a": "chat-a",
        "a-alias": "chat-a",
        "a2": "chat-a",
        "chat-b": "chat-b",
        "b-alias": "chat-b",
        "default": "chat-a",
    }
    # The same weights behind two names answer a greedy request alike.
    texts = {r.choices[0].message.content for r in routed.values()}
    assert len(texts) == 1


def test_unknown_name_is_404_listing_the_served_names(multi: ServerProcess) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        multi.openai().chat.completions.create(model="nope", messages=HELLO, max_tokens=2)
    error = caught.value.body
    assert isinstance(error, dict)
    assert error["code"] == "model_not_found"
    assert error["param"] == "model"
    for name in ("chat-a", "a-alias", "a2", "chat-b", "b-alias", "tiny"):
        assert name in error["message"]


def test_unload_and_load_routes(multi: ServerProcess) -> None:
    with multi.http() as http:
        unloaded = http.post("/models/unload", json={"model": "b-alias"})
        assert unloaded.status_code == 200
        assert unloaded.json()["success"] is True
        assert unloaded.json()["state"] == "unloaded"
        assert _listed(multi)["chat-b"]["state"] == "unloaded"
        # A request for an unloaded model loads it again.
        reply = multi.openai().completions.create(model="chat-b", prompt="Hi", max_tokens=2)
        assert reply.model == "chat-b"
        assert _listed(multi)["chat-b"]["state"] == "loaded"
        assert http.post("/models/unload", json={"model": "chat-b"}).status_code == 200
        loaded = http.post("/models/load", json={"model": "chat-b"})
        assert loaded.status_code == 200
        assert loaded.json()["state"] == "loaded"
        missing = http.post("/models/load", json={"model": "nope"})
        assert missing.status_code == 404
        assert missing.json()["error"]["code"] == "model_not_found"
        extra = http.post("/models/unload", json={"model": "chat-b", "now": True})
        assert extra.status_code == 400


def test_load_and_unload_need_the_api_key(tmp_path: Path) -> None:
    config = _write(tmp_path / "m.yaml", f"models:\n  - model_path: {default_gguf()}\n")
    proc = start(tmp_path, "--config", str(config), "--api-key", "sesame", "-c", "512")
    try:
        with proc.http() as http:
            refused = http.post("/models/unload", json={"model": "default"})
            assert refused.status_code == 401
            name = default_gguf().stem
            headers = {"Authorization": "Bearer sesame"}
            assert http.post("/models/unload", json={"model": name}, headers=headers).is_success
            assert http.post("/models/load", json={"model": name}, headers=headers).is_success
    finally:
        proc.stop()


def test_capabilities_decide_which_model_a_route_gets() -> None:
    registry = ModelRegistry(
        [
            ModelConfig(model=Path("chat.gguf")),
            ModelConfig(model=Path("e5"), kind="embedding", alias="embed", aliases=("e",)),
        ],
        EngineMetrics(CollectorRegistry()),
    )
    assert registry.find(None, "text").name == "chat"
    assert registry.find("default", "embedding").name == "embed"
    assert registry.find("e", "embedding").name == "embed"
    serves = "'embed' cannot do text generation; it serves embeddings"
    with pytest.raises(MissingCapability, match=serves):
        registry.find("embed", "text")
    with pytest.raises(ModelNotFound, match=r"'x' does not exist; served: chat, embed, e"):
        registry.find("x", "text")
    nothing = r"no model here does reranking; .*--reranker-model"
    with pytest.raises(MissingCapability, match=nothing):
        registry.find(None, "rerank")


def test_idle_model_unloads_and_pinned_stays(tmp_path: Path) -> None:
    gguf = default_gguf()
    config = _write(
        tmp_path / "idle.yaml",
        f"""\
models:
  - model_path: {gguf}
    name: idle
    idle_timeout: 0.3s
    ctx_size: 512
  - model_path: {gguf}
    name: kept
    idle_timeout: 0.3
    pinned: true
    ctx_size: 512
""",
    )
    proc = start(tmp_path, "--config", str(config))
    try:
        client = proc.openai()
        for _ in range(3):
            # Whether it is still unloading or already unloaded, a request loads it again.
            _wait_state(proc, "idle", "unloading", "unloaded")
            reply = client.chat.completions.create(model="idle", messages=HELLO, max_tokens=2)
            assert reply.model == "idle"
        _wait_state(proc, "idle", "unloaded")
        assert _listed(proc)["kept"]["state"] == "loaded"
        assert "unloaded model 'idle' (idle for 0.3s)" in proc.log()
    finally:
        proc.stop()


def test_mlx_openai_server_config_loads_unchanged(tmp_path: Path) -> None:
    config = _write(
        tmp_path / "config.yaml",
        f"""\
server:
  host: 127.0.0.1
  port: 8000
  log_level: INFO
  no_log_file: true
models:
  - model_path: {default_gguf()}
    model_type: lm
    served_model_name: smol
    context_length: 1024
    on_demand: false
    enable_auto_tool_choice: true
    tool_call_parser: qwen3
    reasoning_parser: qwen3
    default_temperature: 0.25
    default_max_tokens: 3
    kv_bits: 8
    prompt_cache_size: 10
""",
    )
    proc = start(tmp_path, "--config", str(config))
    try:
        reply = proc.openai().chat.completions.create(model="smol", messages=HELLO)
        assert reply.model == "smol"
        assert reply.usage is not None and reply.usage.completion_tokens <= 3
        with proc.http() as http:
            props = http.get("/props").json()
        assert props["default_generation_settings"]["params"]["temperature"] == 0.25
        # kv_bits 8 is llama.cpp's q8_0 cache, for K and V.
        assert (props["kv_cache"]["type_k"], props["kv_cache"]["type_v"]) == ("q8_0", "q8_0")
        log = proc.log()
        assert "kv_bits: accepted" not in log
        for key, line in (
            ("enable_auto_tool_choice", 12),
            ("prompt_cache_size", 18),
        ):
            assert f"{config}:{line}: models[0].{key}: accepted, not acted on yet" in log
        assert f"{config}:5: server.no_log_file: accepted, not acted on yet" in log
        assert "tool-call parser: hermes" in log
    finally:
        proc.stop()


def test_launch_takes_mlx_openai_server_flags(tmp_path: Path) -> None:
    proc = ServerProcess(
        "--model-path",
        str(default_gguf()),
        "--served-model-name",
        "launched",
        "--context-length",
        "512",
        "--max-tokens",
        "2",
        "--log-level",
        "DEBUG",
        command="launch",
        log_path=tmp_path / "log",
    )
    try:
        proc.wait_ready()
        reply = proc.openai().completions.create(model="launched", prompt="Hello")
        assert reply.model == "launched"
        assert reply.usage is not None and reply.usage.completion_tokens <= 2
        with proc.http() as http:
            assert http.get("/props").json()["default_generation_settings"]["n_ctx"] == 512
    finally:
        proc.stop()


def _refused(tmp_path: Path, *args: str, command: str = "serve") -> str:
    """Run the CLI expecting a refusal before any model loads: its one-line error."""
    result = subprocess.run(
        [MLXCEL, command, *args], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert "Traceback" not in result.stderr
    return lines[-1]


def test_bad_configs_are_one_line_errors_with_exit_code_2(tmp_path: Path) -> None:
    gguf = default_gguf()
    cases = {
        "unknown.yaml": (
            f"models:\n  - model_path: {gguf}\n    contxt_length: 10\n",
            "{file}:3: unknown key 'contxt_length' in models[0]",
        ),
        "dupe.yaml": (
            f"models:\n  - model_path: {gguf}\n    name: a\n"
            f"  - model_path: {gguf}\n    name: b\n    aliases: [a]\n",
            "{file}:6: models[1]: the name 'a' is already models[0]'s; each name and alias "
            "must be unique",
        ),
        "missing.yaml": (
            "models:\n  - name: gone\n    model_path: /nowhere/x.gguf\n",
            "{file}:3: models[0]: model not found: /nowhere/x.gguf",
        ),
        "type.yaml": (
            f"models:\n  - model_path: {gguf}\n    context_length: lots\n",
            "{file}:3: models[0].context_length: expected an integer, got 'lots'",
        ),
        "cost.yaml": (
            f"models:\n  - model_path: {gguf}\n    draft_cost: -1\n",
            "{file}:3: models[0].draft_cost: must be auto or at least 0, got -1",
        ),
        "yaml.yaml": (
            "models: [\n",
            "{file}:2: not valid YAML: expected the node content, but found '<stream end>'",
        ),
        "empty.yaml": (
            "server:\n  port: 9000\n",
            "{file}: no models: the file needs a `models:` list",
        ),
        "top.yaml": (
            f"model:\n  - model_path: {gguf}\n",
            "{file}:1: unknown key 'model' (the file has `server:`, `models:` and `ray:`)",
        ),
        "server.yaml": (
            f"server:\n  prot: 9000\nmodels:\n  - model_path: {gguf}\n",
            "{file}:2: unknown key 'prot' in server",
        ),
    }
    for name, (text, expected) in cases.items():
        file = _write(tmp_path / name, text)
        assert _refused(
            tmp_path, "--config", str(file)
        ) == "mlxcel serve: error: " + expected.format(file=file)
    assert _refused(tmp_path, "--config", "absent.yaml") == (
        "mlxcel serve: error: absent.yaml: no such file"
    )
    both = _write(tmp_path / "ok.yaml", f"models:\n  - model_path: {gguf}\n")
    assert _refused(tmp_path, "--config", str(both), "-m", str(gguf)) == (
        "mlxcel serve: error: --config lists the models; --model cannot be given with it"
    )


def test_side_model_flags_name_what_cannot_be_served(tmp_path: Path) -> None:
    assert _refused(tmp_path, "--image-model", "default") == (
        "mlxcel serve: error: --image-model default: no model of this kind is packaged: "
        "give a folder or a GGUF"
    )
    assert _refused(tmp_path, "--image-model", str(tmp_path)) == (
        f"mlxcel serve: error: --image-model {tmp_path}: not a model directory (no config.json): "
        f"{tmp_path}"
    )
    lone = tmp_path / "lone.safetensors"
    lone.write_bytes(b"")
    assert _refused(tmp_path, "--image-model", str(lone)) == (
        f"mlxcel serve: error: --image-model {lone}: {lone} is a single-file checkpoint outside "
        "a diffusers pipeline folder: put it in a folder holding its base model's "
        "model_index.json, component configs and tokenizer (the weights may be left out)"
    )
    gguf = tmp_path / "sd.gguf"
    gguf.write_bytes(b"GGUF")
    assert _refused(tmp_path, "--image-model", str(gguf)).startswith(
        f"mlxcel serve: error: --image-model {gguf}: {gguf} is a GGUF: GGUF image models are "
        "stable-diffusion.cpp's, which mlxcel does not run"
    )
    assert _refused(tmp_path, "--reranker-model", "default") == (
        "mlxcel serve: error: --reranker-model default: no model of this kind is packaged: "
        "give a folder or a GGUF"
    )
    assert _refused(tmp_path, "--embedding-model", str(tmp_path / "nowhere")) == (
        f"mlxcel serve: error: --embedding-model {tmp_path / 'nowhere'}: no such file or folder"
    )
    assert _refused(tmp_path, "--transcription-model", "nowhere") == (
        "mlxcel serve: error: --transcription-model nowhere: not a folder, nor one of the "
        "packaged models: default, whisper-tiny.en, whisper-base"
    )
    assert _refused(tmp_path, "--max-audio-seconds", "0") == (
        "mlxcel serve: error: --max-audio-seconds must be more than 0"
    )


def test_client_passes_side_models_as_flags() -> None:
    from mlxcel.client._launch import server_args

    args = server_args(
        None, socket_path="/tmp/s", host=None, port=None, options={"embedding_model": "default"}
    )
    assert args[-2:] == ["--embedding-model", "default"]
