"""Embedding, rerank, transcription, speech and image engines across the process boundary, as
the HTTP process serves them.

Each is its kind's capability class (`Embedder`, `Reranker`, `ImageGenerator`) over the
model's worker, or for audio what the routes ask of one (a transcription's info and segments,
a speech file's encoded pieces, read on the event loop): what the worker sent once is kept,
an encoder's methods are calls, an audio engine's iterators and an image batch are streams
read one item at a time (closing one early, or an image batch's `cancelled()`, cancels it in
the worker).
Closing one ends the worker. The worker's side is `worker/services.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import numpy as np

from mlxcel.backends.audio.encode import SpeechFormat
from mlxcel.backends.audio.speech import SpeechJob, Voice
from mlxcel.backends.audio.transcript import Segment, TranscribeJob, TranscriptInfo
from mlxcel.backends.embeddings import EncoderInfo, Unreadable
from mlxcel.engine.handle import call_on_loop
from mlxcel.engine.image_types import ImageEvent, ImageJob, ImageModelInfo, ImageResult
from mlxcel.media.images import EncodedImage
from mlxcel.models.remote import Worker, WorkerGone
from mlxcel.models.textgen import unavailable
from mlxcel.wire.facts import (
    StreamEnd,
    SynthesizerFacts,
    TranscriberFacts,
)

# How often a stream read with a `cancelled` check looks at it while no item comes, so a cancel
# reaches the worker within this (an image batch stops at the first step that ends after it).
CANCEL_POLL_S = 0.05
_NOTHING = object()


class _Items:
    """A stream's items, queued by the worker's reader thread for the thread reading them."""

    def __init__(self) -> None:
        self.queue: queue.SimpleQueue[Any] = queue.SimpleQueue()

    def deliver(self, item: Any) -> None:
        self.queue.put(item)

    def fail(self, error: BaseException) -> None:
        self.queue.put(StreamEnd(error))


def _closes(item: Any) -> bool:
    """Whether a stream's item is its end; the stream's error is raised if it ended with one
    (the worker has forgotten the stream either way, so there is nothing to cancel)."""
    if not isinstance(item, StreamEnd):
        return False
    if item.error is not None:
        raise item.error
    return True


def streamed(
    worker: Worker, method: str, *args: Any, cancelled: Callable[[], bool] | None = None
) -> Iterator[Any]:
    """The items of a worker's stream, each as it comes (blocking: read it on a thread); the
    stream's error, WorkerGone included, is raised where it ends. With `cancelled`, the stream
    is cancelled once that is true, and read on to its end."""
    items = _Items()
    (stream_id,) = worker.stream(method, args, [items])
    ended = False
    try:
        while True:
            try:
                item = items.queue.get(timeout=None if cancelled is None else CANCEL_POLL_S)
            except queue.Empty:
                item = _NOTHING
            if cancelled is not None and cancelled():
                worker.cancel(stream_id)
                cancelled = None
            if item is _NOTHING:
                continue
            ended = _closes(item)
            if ended:
                return
            yield item
    finally:
        if not ended:
            worker.cancel(stream_id)


class _LoopItems:
    """A stream's items, handed by the worker's reader thread straight to the event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.queue: asyncio.Queue[Any] = asyncio.Queue()

    def deliver(self, item: Any) -> None:
        # A loop that has closed has nobody left reading the stream.
        with contextlib.suppress(RuntimeError):
            call_on_loop(self._loop, self.queue.put_nowait, item)

    def fail(self, error: BaseException) -> None:
        self.deliver(StreamEnd(error))


async def streamed_async(
    worker: Worker, method: str, *args: Any, start_on_thread: bool = False
) -> AsyncIterator[Any]:
    """The items of a worker's stream on the event loop, each as it comes, with no thread
    between the worker's reader and the loop; the stream's error, WorkerGone included, is
    raised where it ends. Its arguments are sent from the loop, or from a thread with
    `start_on_thread` (for large ones: a transcription's audio). Closing it early cancels the
    stream in the worker."""
    items = _LoopItems(asyncio.get_running_loop())
    if start_on_thread:
        (stream_id,) = await asyncio.to_thread(worker.stream, method, args, [items])
    else:
        (stream_id,) = worker.stream(method, args, [items])
    ended = False
    try:
        while True:
            item = await items.queue.get()
            ended = _closes(item)
            if ended:
                return
            yield item
    finally:
        if not ended:
            worker.cancel(stream_id)


class _Remote:
    """An engine in a worker: closing it ends the worker (and frees every byte of the model)."""

    def __init__(self, worker: Worker) -> None:
        self._worker = worker

    def close(self) -> None:
        self._worker.stop()


class RemoteEmbedder(_Remote):
    """`Embedder` in a worker."""

    def __init__(self, worker: Worker, info: EncoderInfo) -> None:
        super().__init__(worker)
        self.info = info

    def tokenize(self, texts: list[str]) -> list[list[int]]:
        tokens: list[list[int]] = self._worker.call("tokenize", texts)
        return tokens

    def embed(self, batch: list[list[int]]) -> list[np.ndarray]:
        vectors: list[np.ndarray] = self._worker.call("embed", batch)
        return vectors

    def tokenize_queries(self, texts: list[str]) -> list[list[int]]:
        tokens: list[list[int]] = self._worker.call("tokenize_queries", texts)
        return tokens

    def embed_images(self, images: list[EncodedImage]) -> list[np.ndarray | Unreadable]:
        vectors: list[np.ndarray | Unreadable] = self._worker.call("embed_images", images)
        return vectors


class RemoteReranker(_Remote):
    """`Reranker` in a worker."""

    def __init__(self, worker: Worker, info: EncoderInfo) -> None:
        super().__init__(worker)
        self.info = info

    def tokenize_pairs(self, query: str, documents: list[str]) -> list[list[int]]:
        tokens: list[list[int]] = self._worker.call("tokenize_pairs", query, documents)
        return tokens

    def score(self, batch: list[list[int]]) -> list[float]:
        scores: list[float] = self._worker.call("score", batch)
        return scores


class RemoteTranscriber(_Remote):
    """`Transcriber` in a worker."""

    def __init__(self, worker: Worker, facts: TranscriberFacts) -> None:
        super().__init__(worker)
        self._facts = facts

    @property
    def multilingual(self) -> bool:
        return self._facts.multilingual

    @property
    def parallel(self) -> int:
        return self._facts.parallel

    def transcribe(self, job: TranscribeJob) -> AsyncIterator[TranscriptInfo | Segment]:
        """The info, then each segment as the worker decodes it."""
        return streamed_async(self._worker, "transcribe", job, start_on_thread=True)

    def speech_probabilities(self, samples: np.ndarray, context: np.ndarray | None) -> np.ndarray:
        """Silero's probability of speech per 32 ms window of 16 kHz `samples`, reckoned in the
        worker (blocking: call on a thread)."""
        scores: np.ndarray = self._worker.call("speech_probabilities", samples, context)
        return scores


class RemoteSynthesizer(_Remote):
    """`Synthesizer` in a worker."""

    def __init__(self, worker: Worker, facts: SynthesizerFacts) -> None:
        super().__init__(worker)
        self._facts = facts

    @property
    def sample_rate(self) -> int:
        return self._facts.sample_rate

    @property
    def default_voice(self) -> str:
        return self._facts.default_voice

    def voices(self) -> list[Voice]:
        return list(self._facts.voices)

    def speak(self, job: SpeechJob, fmt: SpeechFormat) -> AsyncIterator[bytes]:
        """The file in `fmt`, in pieces as the worker synthesises and encodes each sentence."""
        return streamed_async(self._worker, "speak", job, fmt)


class RemoteImageGenerator(_Remote):
    """`ImageGenerator` in a worker: one batch at a time (its queue sees to that)."""

    def __init__(self, worker: Worker, info: ImageModelInfo) -> None:
        super().__init__(worker)
        self.info = info

    def generate(
        self, job: ImageJob, emit: Callable[[ImageEvent], None], cancelled: Callable[[], bool]
    ) -> ImageResult:
        """Run one batch in the worker; GenerationCancelled once `cancelled()` is true between
        steps, EngineError(code='model_unavailable') if the worker dies."""
        result: ImageResult | None = None
        try:
            for item in streamed(self._worker, "generate", job, cancelled=cancelled):
                if isinstance(item, ImageResult):
                    result = item
                else:
                    emit(item)
        except WorkerGone as exc:
            raise unavailable(exc) from exc
        if result is None:
            raise RuntimeError("the image batch ended without its images")
        return result
