"""A web page in the user's browser cannot drive the server: the Host allowlist (DNS
rebinding), foreign origins refused before any work, and no disk paths for an open server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import serving
from tests.server_process import ServerProcess

HELLO = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}
KEY = "sekrit-key"


@pytest.fixture(scope="module")
def named(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server that also answers to one more name, with an API key."""
    yield from serving(tmp_path_factory, "named", "--allowed-hosts", "llm.lan", "--api-key", KEY)


def _generated(server: ServerProcess) -> float:
    return server.metric("mlxcel_generation_tokens_total")


@pytest.mark.parametrize(
    "host", ["evil.example", "evil.example:8080", "127.0.0.1.evil.example", "localhost.evil"]
)
def test_a_foreign_host_is_refused(http: httpx.Client, host: str) -> None:
    for path in ("/health", "/v1/models", "/"):
        response = http.get(path, headers={"Host": host})
        assert response.status_code == 400, (path, response.text)
        assert response.json()["error"]["code"] == "host_not_allowed"


@pytest.mark.parametrize(
    "host",
    ["127.0.0.1", "127.0.0.1:8080", "localhost:1234", "app.localhost", "[::1]:80", "10.1.2.3"],
)
def test_addresses_and_loopback_names_are_accepted(http: httpx.Client, host: str) -> None:
    assert http.get("/health", headers={"Host": host}).status_code == 200


def test_allowed_hosts_adds_names(named: ServerProcess) -> None:
    with named.http() as http:
        assert http.get("/health", headers={"Host": "llm.lan:8080"}).status_code == 200
        assert http.get("/health", headers={"Host": "other.lan"}).status_code == 400


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", ""])
def test_a_simple_cross_origin_post_runs_nothing(
    server: ServerProcess, http: httpx.Client, content_type: str
) -> None:
    """What a page elsewhere can send without a preflight: refused before generating."""
    before = _generated(server)
    response = http.post(
        "/v1/chat/completions",
        content=httpx.Request("POST", "/", json={**HELLO, "max_tokens": 8}).content,
        headers={"Origin": "http://evil.example", "Content-Type": content_type},
    )
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "cors_origin_not_allowed"
    assert _generated(server) == before
    # Without the Origin header (curl, an SDK) the same body is served.
    assert http.post("/v1/chat/completions", json=HELLO).status_code == 200


def test_the_servers_own_origin_is_served(server: ServerProcess, http: httpx.Client) -> None:
    """The playground at / calls the API from the server's own origin."""
    own = f"http://127.0.0.1:{server.port}"
    assert http.post("/v1/chat/completions", json=HELLO, headers={"Origin": own}).status_code == 200
    other_port = f"http://127.0.0.1:{server.port + 1}"
    refused = http.post("/v1/chat/completions", json=HELLO, headers={"Origin": other_port})
    assert refused.status_code == 403
    assert http.get("/v1/models", headers={"Origin": "null"}).status_code == 403


def test_models_hide_the_disk_path_without_a_key(http: httpx.Client, named: ServerProcess) -> None:
    listed = http.get("/v1/models").json()["data"][0]
    assert "path" not in listed["meta"] and listed["meta"]["backend"] == "llama.cpp"
    name = http.get("/props").json()["model_path"]
    assert name.endswith(".gguf") and "/" not in name
    with named.http(headers={"Authorization": f"Bearer {KEY}"}) as keyed:
        assert keyed.get("/v1/models").json()["data"][0]["meta"]["path"].endswith(".gguf")
        assert keyed.get("/props").json()["model_path"].startswith("/")


def test_non_ascii_api_keys_are_refused_at_startup(tmp_path: Path) -> None:
    for key in ("clé", "two words", "tab\there"):
        proc = ServerProcess("--api-key", key, log_path=tmp_path / "server.log")
        proc.process.wait(timeout=60)
        assert proc.process.returncode == 2
        assert "printable ASCII" in proc.log()
        proc.stop()
