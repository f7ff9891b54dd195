"""Stored responses for GET/DELETE /v1/responses/{id} and previous_response_id."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

MAX_ENTRIES = 1000
MAX_BYTES = 64 * 1024 * 1024
TTL_SECONDS = 24 * 3600


@dataclass(frozen=True)
class StoredResponse:
    """A finished response and the conversation that a follow-up continues."""

    response: dict[str, Any]
    messages: list[dict[str, Any]]
    size: int
    expires: float
    images: tuple[str, ...] = ()
    """The URLs of the conversation's images, in the order their markers sit in `messages`:
    a follow-up loads them again under the media policy of its own request."""


class ResponseStore:
    """Recent responses by id, bounded in count, bytes and age; the oldest go first.

    Used only from the event loop, so a plain dict needs no lock. Entries are kept in the
    order they were stored, which is also the order they expire in.
    """

    def __init__(
        self,
        max_entries: int = MAX_ENTRIES,
        max_bytes: int = MAX_BYTES,
        ttl: float = TTL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.ttl = ttl
        self._clock = clock
        self._entries: dict[str, StoredResponse] = {}
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def total_bytes(self) -> int:
        """Approximate size of everything stored, as JSON."""
        return self._bytes

    def put(
        self,
        response: dict[str, Any],
        messages: list[dict[str, Any]],
        images: tuple[str, ...] = (),
    ) -> None:
        """Keep a response, its conversation and its images' URLs, evicting the oldest to make
        room."""
        size = len(json.dumps([response, messages, images], ensure_ascii=False))
        if size > self.max_bytes:
            logger.warning(
                "%s not stored: %d bytes is over the store's limit", response["id"], size
            )
            return
        self._evict(incoming=size)
        entry = StoredResponse(response, messages, size, self._clock() + self.ttl, images)
        self._entries[response["id"]] = entry
        self._bytes += size

    def get(self, response_id: str) -> StoredResponse | None:
        """The stored response, unless it was never stored, expired or was deleted."""
        self._evict()
        return self._entries.get(response_id)

    def delete(self, response_id: str) -> bool:
        """Forget a response; False if there was none by that id."""
        self._evict()
        entry = self._entries.pop(response_id, None)
        if entry is None:
            return False
        self._bytes -= entry.size
        return True

    def _evict(self, incoming: int | None = None) -> None:
        """Drop expired entries, and the oldest ones until `incoming` more bytes fit."""
        now = self._clock()
        while self._entries:
            oldest_id, oldest = next(iter(self._entries.items()))
            if oldest.expires > now and (incoming is None or self._fits(incoming)):
                return
            del self._entries[oldest_id]
            self._bytes -= oldest.size

    def _fits(self, size: int) -> bool:
        return len(self._entries) < self.max_entries and self._bytes + size <= self.max_bytes
