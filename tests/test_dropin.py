"""llama-server's flags and shapes that its own tests (tools/server/tests) use, over HTTP.

One server started with llama-server's spellings (a `localhost` CORS keyword, a bare host name)
answers in the shapes llama-server's test suite asserts, beside ours.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import serving
from tests.server_process import ServerProcess

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def dropin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """llama-server's spellings of the listening and CORS flags."""
    yield from serving(tmp_path_factory, "dropin", "--cors-origins", "localhost,app.example")


def _preflight(server: ServerProcess, origin: str) -> httpx.Response:
    headers = {
        "Origin": origin,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "Authorization",
    }
    with server.http() as http:
        return http.options("/completions", headers=headers)


@pytest.mark.parametrize(
    "origin",
    [
        "http://localhost",
        "http://localhost:8080",
        "http://127.0.0.1:3000",
        "http://[::1]:3000",
        "https://app.example",
        "http://app.example:5173",
    ],
)
def test_cors_localhost_keyword_and_host_names_allow_any_port(
    dropin: ServerProcess, origin: str
) -> None:
    response = _preflight(dropin, origin)
    assert response.status_code == 204, response.text
    assert response.headers["access-control-allow-origin"] == origin


@pytest.mark.parametrize(
    "origin",
    ["http://evil.com", "http://notlocalhost", "http://localhost.evil.com", "ftp://app.example"],
)
def test_cors_localhost_keyword_refuses_other_hosts(dropin: ServerProcess, origin: str) -> None:
    response = _preflight(dropin, origin)
    assert response.status_code == 403
    assert "access-control-allow-origin" not in response.headers
    with dropin.http(headers={"Origin": origin}) as http:
        assert http.get("/v1/models").status_code == 403
