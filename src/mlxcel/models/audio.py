"""A loaded speech model: its engine (in the model's worker process, behind its capability
class, Transcriber or Synthesizer, which takes and gives plain data only), how many requests it
runs at once, and the limits it enforces."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from mlxcel.models.proxies import RemoteSynthesizer, RemoteTranscriber
from mlxcel.models.remote import Worker


@dataclass
class AudioModel:
    """What audio models share: a name, a bound on requests running side by side, and the
    worker process its engine runs in."""

    name: str
    parallel: int
    worker: Worker = field(kw_only=True)
    _slots: asyncio.Semaphore | None = field(default=None, init=False, repr=False)

    @contextlib.asynccontextmanager
    async def place(self) -> AsyncIterator[None]:
        """One of the model's `parallel` places, held until the block ends."""
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.parallel)
        async with self._slots:
            yield


@dataclass
class TranscriptionModel(AudioModel):
    """A speech-to-text model."""

    engine: RemoteTranscriber = field(kw_only=True)

    def close(self) -> None:
        """End the worker: every byte of the model goes."""
        self.engine.close()


@dataclass
class SpeechModel(AudioModel):
    """A text-to-speech model."""

    engine: RemoteSynthesizer = field(kw_only=True)

    def close(self) -> None:
        """End the worker: every byte of the model goes."""
        self.engine.close()
