"""What a request's media may be and where it may come from; one error type for refusals."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

MiB = 1024 * 1024


class MediaError(Exception):
    """Media the server refuses or could not read: a 400 with this message, param and code."""

    def __init__(self, message: str, code: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.param = param


@dataclass(frozen=True)
class MediaLimits:
    """Per-request limits; each has its own flag and its own 400."""

    max_images: int = 16
    """Images in one request (--media-max-images)."""
    max_image_bytes: int = 16 * MiB
    """Encoded bytes of one image (--media-max-image-bytes)."""
    max_pixels: int = 32 * MiB
    """Width times height of one image, checked before it is decoded (--media-max-pixels)."""
    max_total_bytes: int = 64 * MiB
    """Encoded bytes of all a request's images together, and of all its audio clips together
    (--media-max-bytes)."""
    max_audio_seconds: float = 3600.0
    """Seconds of all a request's audio clips together (--max-audio-seconds, which also bounds
    a transcription)."""


@dataclass(frozen=True)
class MediaPolicy:
    """Where media may come from. Everything but data URIs is off unless a flag allows it."""

    limits: MediaLimits = field(default_factory=MediaLimits)
    allow_remote: bool = False
    """Fetch http(s) URLs (--allow-remote-media)."""
    allow_insecure: bool = False
    """Also plain http:// (--allow-insecure-media); HTTPS only otherwise."""
    allow_hosts: frozenset[str] = frozenset()
    """Hosts whose addresses are not checked (--media-allow-hosts): loopback, LAN, ..."""
    local_dir: Path | None = None
    """file:// paths are read only from inside this directory (--allowed-local-media)."""
    fetch_timeout: float = 10.0
    """Seconds one URL may take, redirects and body included (--media-fetch-timeout)."""
    max_redirects: int = 3
    """Redirect hops followed, each checked like the first URL (--media-max-redirects; 0: none)."""

    def host_allowed(self, host: str) -> bool:
        """Whether `host` (as written in a URL) is listed in --media-allow-hosts."""
        return host.lower().strip("[]") in self.allow_hosts


def parse_hosts(text: str) -> frozenset[str]:
    """--media-allow-hosts' comma-separated list, normalised as host_allowed compares."""
    return frozenset(h.strip().lower().strip("[]") for h in text.split(",") if h.strip())
