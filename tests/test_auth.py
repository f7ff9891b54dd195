"""API keys: Bearer or X-Api-Key from flags, a file or the environment; /health stays public."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.conftest import start
from tests.server_process import ServerProcess

pytestmark = pytest.mark.slow

HELLO = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("keyed")
    key_file = tmp / "keys.txt"
    key_file.write_text("from-file\n\n")
    proc = start(
        tmp,
        "--api-key",
        "from-flag",
        "--api-key-file",
        str(key_file),
        "--alias",
        "smol",
        env={"MLXCEL_API_KEY": "from-env,second-env"},
    )
    yield proc
    proc.stop_soon()


def test_missing_and_wrong_keys_are_401(keyed: ServerProcess) -> None:
    with keyed.http() as http:
        for headers in ({}, {"Authorization": "Bearer nope"}, {"X-Api-Key": "nope"}):
            response = http.get("/v1/models", headers=headers)
            assert response.status_code == 401
            assert response.json()["error"]["type"] == "authentication_error"
        bad = openai.OpenAI(base_url=keyed.base_url, api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            bad.chat.completions.create(model="smol", messages=HELLO)  # type: ignore[arg-type]


@pytest.mark.parametrize("key", ["from-flag", "from-file", "from-env", "second-env"])
def test_every_configured_key_works(keyed: ServerProcess, key: str) -> None:
    with keyed.http() as http:
        assert http.get("/v1/models", headers={"X-Api-Key": key}).status_code == 200
    good = openai.OpenAI(base_url=keyed.base_url, api_key=key, max_retries=0)
    response = good.chat.completions.create(model="smol", messages=HELLO, max_tokens=2)  # type: ignore[arg-type]
    assert response.model == "smol"


def test_only_a_key_on_the_command_line_is_warned_about(
    keyed: ServerProcess, tmp_path: Path
) -> None:
    """Any user of the machine reads a process's command line (ps): the server says so when
    a key comes from --api-key, and not when it comes from a file or the environment."""
    assert "--api-key puts the key in the command line" in keyed.log()
    assert "--api-key-file FILE or $MLXCEL_API_KEY" in keyed.log()
    key_file = tmp_path / "keys.txt"
    key_file.write_text("from-file\n")
    quiet = start(tmp_path, "--api-key-file", str(key_file), env={"MLXCEL_API_KEY": "env"})
    try:
        with quiet.http() as http:
            assert http.get("/v1/models", headers={"X-Api-Key": "from-file"}).status_code == 200
        assert "--api-key puts" not in quiet.log()
    finally:
        quiet.stop()


def test_health_is_public(keyed: ServerProcess) -> None:
    with keyed.http() as http:
        assert http.get("/health").json() == {"status": "ok"}
        assert http.get("/v1/health").status_code == 200


def test_models_lists_the_alias(keyed: ServerProcess) -> None:
    client = openai.OpenAI(base_url=keyed.base_url, api_key="from-flag", max_retries=0)
    assert [m.id for m in client.models.list()] == ["smol"]


def test_models_lists_the_file_stem(client: openai.OpenAI) -> None:
    models = client.models.list()
    assert [m.id for m in models] == ["SmolLM2-135M-Instruct.Q4_1"]
    assert models.data[0].object == "model"


def test_missing_key_file_fails_fast(tmp_path: Path) -> None:
    proc = ServerProcess("--api-key-file", str(tmp_path / "absent"), log_path=tmp_path / "log")
    assert proc.process.wait(timeout=60) == 2
    proc.stop()
    assert "absent" in proc.log()
