"""A stand-in for the Hugging Face Hub on loopback: the API route that lists a repo's files and
the `resolve` route that serves them (HEAD and ranged GET), for a few repos the test gives.
`HF_ENDPOINT` pointed at it makes huggingface_hub, and so `mlxcel pull`, use it."""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

SHA = "0123456789abcdef0123456789abcdef01234567"


@dataclass
class FakeHub:
    """Repos (id -> {file name: bytes}), gated repos, and what happened."""

    repos: dict[str, dict[str, bytes]]
    gated: set[str] = field(default_factory=set)
    cut_once: set[str] = field(default_factory=set)
    """Files whose first GET stops after half their bytes (the connection cut)."""
    stall_once: set[str] = field(default_factory=set)
    """Files whose first GET stops sending after 12 MiB until `release` is set (or 60 s)."""
    release: threading.Event = field(default_factory=threading.Event)
    sizes: dict[str, int] = field(default_factory=dict)
    """Sizes the listing claims for files, in place of their real ones."""
    ranges: list[tuple[str, str | None]] = field(default_factory=list)
    """(file, its Range header) of each GET of a file."""
    url: str = ""

    def _repo(self, path: str) -> tuple[str, str] | None:
        parts = path.strip("/").split("/")
        if len(parts) >= 2 and "/".join(parts[:2]) in self.repos | dict.fromkeys(self.gated):
            return "/".join(parts[:2]), "/".join(parts[2:])
        return None


def _handler(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def _error(self, status: int, code: str) -> None:
            body = json.dumps({"error": code}).encode()
            self.send_response(status)
            self.send_header("X-Error-Code", code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            self._serve(head=False)

        def do_HEAD(self) -> None:
            self._serve(head=True)

        def _serve(self, head: bool) -> None:
            path = unquote(urlsplit(self.path).path)
            if path.startswith("/api/models/"):
                self._listing(path.removeprefix("/api/models/"))
                return
            found = hub._repo(path)
            if found is None:
                self._error(404, "RepoNotFound")
                return
            repo, rest = found
            if repo in hub.gated:
                self._error(403, "GatedRepo")
                return
            if not rest.startswith("resolve/"):
                self._error(404, "EntryNotFound")
                return
            name = rest.split("/", 2)[2]
            data = hub.repos[repo].get(name)
            if data is None:
                self._error(404, "EntryNotFound")
                return
            self._file(name, data, head)

        def _listing(self, rest: str) -> None:
            parts = rest.strip("/").split("/")
            repo = "/".join(parts[:2])
            if repo in hub.gated:
                self._error(403, "GatedRepo")
                return
            if repo not in hub.repos:
                self._error(404, "RepoNotFound")
                return
            siblings = [
                {"rfilename": name, "size": hub.sizes.get(name, len(data))}
                for name, data in hub.repos[repo].items()
            ]
            body = json.dumps({"id": repo, "sha": SHA, "siblings": siblings}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _file(self, name: str, data: bytes, head: bool) -> None:
            start = 0
            ranged = self.headers.get("Range")
            if ranged and ranged.startswith("bytes="):
                start = int(ranged.removeprefix("bytes=").split("-")[0])
            self.send_response(206 if start else 200)
            self.send_header("X-Repo-Commit", SHA)
            self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("Content-Length", str(len(data) - start))
            if start:
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            self.end_headers()
            if head:
                return
            hub.ranges.append((name, ranged))
            if name in hub.cut_once:
                hub.cut_once.discard(name)
                self.wfile.write(data[start : len(data) // 2])
                self.wfile.flush()
                self.close_connection = True
                self.connection.shutdown(2)
                return
            if name in hub.stall_once:
                hub.stall_once.discard(name)
                self.wfile.write(data[start : start + (12 << 20)])
                self.wfile.flush()
                hub.release.wait(60)
                self.close_connection = True
                return
            self.wfile.write(data[start:])

    return Handler


@contextmanager
def fake_hub(hub: FakeHub) -> Iterator[FakeHub]:
    """Serve `hub` on a free loopback port while the block runs; `hub.url` is its endpoint."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(hub))
    hub.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield hub
    finally:
        server.shutdown()
        server.server_close()
