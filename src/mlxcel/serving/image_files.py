"""The images a `response_format: url` answer links to (GET /v1/images/files/{id}), kept
for a bounded time and a bounded total size; the oldest go first."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class ImageFile:
    """One encoded image and when it goes."""

    data: bytes
    media_type: str
    expires: float


class ImageFiles:
    """Encoded images by id. Used only from the event loop, so a dict needs no lock; it keeps
    insertion order, which is also expiry order."""

    def __init__(
        self, ttl: float, max_bytes: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.ttl = ttl
        self.max_bytes = max_bytes
        self._clock = clock
        self._files: dict[str, ImageFile] = {}
        self._bytes = 0

    def put(self, data: bytes, media_type: str) -> str:
        """Keep an image, dropping the oldest until it fits; its id."""
        self._drop(len(data))
        file_id = f"img-{uuid.uuid4().hex}"
        if len(data) <= self.max_bytes:
            self._files[file_id] = ImageFile(data, media_type, self._clock() + self.ttl)
            self._bytes += len(data)
        return file_id

    def get(self, file_id: str) -> ImageFile | None:
        """The image, unless it expired, was pushed out, or never was."""
        self._drop(0)
        return self._files.get(file_id)

    def _drop(self, incoming: int) -> None:
        now = self._clock()
        while self._files:
            oldest_id, oldest = next(iter(self._files.items()))
            if oldest.expires > now and self._bytes + incoming <= self.max_bytes:
                return
            del self._files[oldest_id]
            self._bytes -= len(oldest.data)
