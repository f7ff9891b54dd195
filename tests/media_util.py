"""Helpers for the vision tests: images in every format, and HTTP servers on 127.0.0.1."""

from __future__ import annotations

import base64
import io
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from PIL import Image

MIME = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp", "GIF": "image/gif"}


def image_bytes(fmt: str = "PNG", size: tuple[int, int] = (16, 16), color: int = 0) -> bytes:
    """An encoded picture: a gradient shifted by `color`, so two colours are two images."""
    image = Image.new("RGB", size)
    image.putdata(
        [
            ((x * 16 + color) % 256, (y * 16) % 256, color % 256)
            for y in range(size[1])
            for x in range(size[0])
        ]
    )
    out = io.BytesIO()
    image.save(out, format=fmt)
    return out.getvalue()


def data_uri(data: bytes, mime: str = "image/png") -> str:
    """`data` as a base64 data: URI."""
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def bomb_png(side: int = 8000) -> bytes:
    """A small PNG that decodes to side*side pixels (a decompression bomb)."""
    out = io.BytesIO()
    Image.new("L", (side, side)).save(out, format="PNG")
    return out.getvalue()


# A route: (status, headers, body, seconds to stall before the body).
Route = tuple[int, dict[str, str], bytes, float]


@contextmanager
def http_server(routes: dict[str, Route] | Callable[[str], Route]) -> Iterator[tuple[str, list]]:
    """A threaded HTTP server on 127.0.0.1 serving `routes`; its base URL and the requests'
    (path, Host header) pairs."""
    seen: list[tuple[str, str | None]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append((self.path, self.headers.get("Host")))
            route = routes(self.path) if callable(routes) else routes.get(self.path)
            if route is None:
                route = (404, {}, b"not found", 0.0)
            status, headers, body, stall = route
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            try:
                if stall:
                    self.wfile.write(body[:1])
                    self.wfile.flush()
                    time.sleep(stall)
                    self.wfile.write(body[1:])
                else:
                    self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):
                pass

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()
