"""A corpus of malformed requests: each is a 4xx in the route's envelope, the server's memory
stays bounded, and the next good request is answered."""

from __future__ import annotations

import socket

import httpx
import pytest

from tests.server_process import ServerProcess

CHAT = "/v1/chat/completions"
GOOD = b'{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}'
MESSAGES = b'"messages": [{"role": "user", "content": "Hi"}]'
ROUTES = (
    CHAT,
    "/v1/completions",
    "/v1/responses",
    "/completion",
    "/tokenize",
    "/v1/messages",
    "/v1/images/generations",
    "/v1/images/edits",
)
JSON = "application/json"
# (what it is, body, content type)
CORPUS: list[tuple[str, bytes, str]] = [
    ("empty body", b"", JSON),
    ("whitespace", b"   \n", JSON),
    ("not JSON", b"hello", JSON),
    ("truncated JSON", GOOD[:-9], JSON),
    ("trailing garbage", GOOD + b"}}", JSON),
    ("a JSON array", b"[1, 2]", JSON),
    ("a JSON string", b'"messages"', JSON),
    ("null", b"null", JSON),
    ("NaN", b'{"temperature": NaN, ' + MESSAGES + b"}", JSON),
    ("invalid UTF-8", b'{"messages": [{"role": "user", "content": "\xc3\x28"}]}', JSON),
    ("UTF-16 body", GOOD.decode().encode("utf-16"), JSON),
    ("a lone surrogate", b'{"prompt": "\\udc00", "content": "\\udc00", ' + MESSAGES + b"}", JSON),
    ("wrong types", b'{"messages": "hi", "prompt": 5, "content": [], "max_tokens": "x"}', JSON),
    ("a huge number", b'{"max_tokens": 1e999, ' + MESSAGES + b"}", JSON),
    ("5000 digits", b'{"max_tokens": ' + b"7" * 5000 + b", " + MESSAGES + b"}", JSON),
    ("deep nesting", b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", JSON),
    ("an unknown field", b'{"no_such_field": 1, ' + MESSAGES + b"}", JSON),
    ("XML", b"<messages><m>hi</m></messages>", "application/xml"),
    ("multipart", b"--x\r\n\r\nhi\r\n--x--\r\n", "multipart/form-data; boundary=x"),
]


def _assert_envelope(path: str, response: httpx.Response) -> None:
    assert 400 <= response.status_code < 500, (path, response.status_code, response.text[:300])
    body = response.json()
    if path == "/v1/messages":
        assert body["type"] == "error" and body["error"]["message"]
    else:
        assert body["error"]["message"] and body["error"]["type"]


@pytest.mark.parametrize(("what", "body", "content_type"), CORPUS, ids=[c[0] for c in CORPUS])
def test_every_malformed_body_is_a_4xx_in_the_envelope(
    http: httpx.Client, what: str, body: bytes, content_type: str
) -> None:
    for path in ROUTES:
        response = http.post(path, content=body, headers={"Content-Type": content_type})
        _assert_envelope(path, response)
    assert http.post(CHAT, content=GOOD, headers={"Content-Type": JSON}).status_code == 200


def test_oversized_bodies_are_413(server: ServerProcess, http: httpx.Client) -> None:
    before = server.resident_bytes()
    enormous = b'{"messages": [{"role": "user", "content": "' + b"a" * (33 << 20) + b'"}]}'
    for path in ROUTES:
        _assert_envelope(path, http.post(path, content=enormous, headers={"Content-Type": JSON}))
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.settimeout(60)
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nContent-Length: 999999999999\r\n\r\n{"
        )
        assert sock.recv(100).startswith(b"HTTP/1.1 413")
    # The bodies were refused as they came, not held: memory stays near where it was.
    assert server.resident_bytes() - before < 256 << 20
    assert http.post(CHAT, content=GOOD, headers={"Content-Type": JSON}).status_code == 200


def test_a_body_cut_off_by_the_client_leaves_the_server_answering(
    server: ServerProcess, http: httpx.Client
) -> None:
    for path in ROUTES:
        with socket.create_connection(("127.0.0.1", server.port)) as sock:
            sock.sendall(
                f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(GOOD)}\r\n\r\n".encode()
                + GOOD[:20]
            )
    assert http.post(CHAT, content=GOOD, headers={"Content-Type": JSON}).status_code == 200
