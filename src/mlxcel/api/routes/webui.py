"""The browser playground: GET / and its static files under /webui/ (none with --no-webui)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib.resources import files

from fastapi import APIRouter, Request
from fastapi.responses import Response

from mlxcel.protocol.errors import APIError

MEDIA_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}
# The page talks to its own origin only: a reply rendered as Markdown can neither run script
# nor send the API key anywhere else. Images and audio the page makes itself are data: or blob:.
POLICY = "; ".join(
    (
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data: blob:",
        "media-src 'self' blob:",
        "connect-src 'self'",
        "form-action 'none'",
        "base-uri 'none'",
        "frame-ancestors 'none'",
    )
)


@dataclass(frozen=True)
class Asset:
    """One static file, read once when the app is built."""

    body: bytes
    media_type: str
    etag: str

    def response(self, request: Request) -> Response:
        """The file, or 304 when the browser holds this version already."""
        headers = {
            "ETag": self.etag,
            "Cache-Control": "no-cache",
            "Content-Security-Policy": POLICY,
            "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "no-referrer",
        }
        if request.headers.get("if-none-match") == self.etag:
            return Response(status_code=304, headers=headers)
        return Response(self.body, media_type=self.media_type, headers=headers)


def load_assets() -> dict[str, Asset]:
    """Every servable file of the mlxcel.webui package, by name."""
    assets = {}
    for entry in files("mlxcel.webui").iterdir():
        media_type = MEDIA_TYPES.get("." + entry.name.rpartition(".")[2])
        if media_type is None or not entry.is_file():
            continue
        body = entry.read_bytes()
        etag = '"' + hashlib.sha256(body).hexdigest()[:16] + '"'
        assets[entry.name] = Asset(body, media_type, etag)
    return assets


def webui_router() -> APIRouter:
    """Routes for the page; public, since the page is what asks for the API key."""
    assets = load_assets()
    router = APIRouter(include_in_schema=False)

    @router.get("/")
    async def page(request: Request) -> Response:
        return assets["index.html"].response(request)

    @router.get("/webui/{name}")
    async def asset(name: str, request: Request) -> Response:
        found = assets.get(name)
        if found is None:
            raise APIError(404, f"no such file: /webui/{name}", code="not_found")
        return found.response(request)

    return router
