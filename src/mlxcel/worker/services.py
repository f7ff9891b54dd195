"""Embedding, rerank, transcription, speech and image models as their worker processes serve
them (`worker/main.py`'s `Service`).

Each opens its engine in the worker, tells the HTTP process its facts once, and answers the
engine's narrow capability methods: an encoder's as calls (`tokenize`, `embed`,
`tokenize_pairs`, `score`: one batch per call, batched across requests in the HTTP process),
an audio model's iterators as streams (`transcribe`: the info, then each segment; `speak`:
the encoded file, a piece per sentence), an image model's batch as a stream (`generate`: each
step's progress and previews, then the images), one item per step, closed by `StreamEnd`.
The HTTP process's side is `models/proxies.py`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from mlxcel.backends.audio.encode import AudioEncoder, SpeechFormat
from mlxcel.backends.audio.speech import SpeechJob, Synthesizer
from mlxcel.backends.audio.transcript import Segment, TranscribeJob, Transcriber, TranscriptInfo
from mlxcel.backends.audio.voice_activity import speech_probabilities
from mlxcel.backends.embeddings import (
    Embedder,
    EmbedsImages,
    EncoderInfo,
    EncoderOptions,
    Reranker,
    TakesQueries,
    Unreadable,
    open_embedder,
    open_reranker,
)
from mlxcel.config.settings import ModelConfig
from mlxcel.engine.image_types import GenerationCancelled, ImageGenerator, ImageJob, ImageModelInfo
from mlxcel.media.images import EncodedImage
from mlxcel.progress import progress
from mlxcel.wire.facts import StreamEnd, SynthesizerFacts, TranscriberFacts
from mlxcel.worker.audio import open_synthesizer, open_transcriber
from mlxcel.worker.images import open_image_generator
from mlxcel.worker.outbox import StreamSink, picklable

logger = logging.getLogger(__name__)

# The threads streams run on, kept between them: starting a thread waits for it to take the
# GIL, which another stream's Python holds for milliseconds at a time (from a speech stream's
# message to its thread running: 0.11-0.47 ms on a new thread and up to 4.4 ms, 0.11-0.35 ms
# on a kept one). The HTTP process bounds a model's streams at once to its `parallel`; past 8
# a stream waits for a thread, as a request waits for a place.
_STREAMS = ThreadPoolExecutor(8, thread_name_prefix="stream")


class EngineService:
    """What the services here share: streams are iterators run on a thread each."""

    calls: frozenset[str] = frozenset()
    streams: frozenset[str] = frozenset()

    def is_last(self, item: Any) -> bool:
        """Whether a stream's item closes it."""
        return isinstance(item, StreamEnd)

    @staticmethod
    def on_thread(sinks: Sequence[StreamSink], work: Callable[[StreamSink], None]) -> None:
        """Run `work` with the stream's one sink on a thread of the pool, then close the stream
        (with the error `work` raised, if it did; an image batch's GenerationCancelled is its
        answer to a cancel, not a failure to log)."""
        (sink,) = sinks

        def run() -> None:
            try:
                work(sink)
            except GenerationCancelled as exc:
                sink.deliver(StreamEnd(exc))
                return
            except Exception as exc:
                logger.exception("a stream of the model failed")
                sink.deliver(StreamEnd(picklable(exc)))
                return
            sink.deliver(StreamEnd())

        _STREAMS.submit(run)

    @classmethod
    def iterate(cls, sinks: Sequence[StreamSink], steps: Iterator[Any]) -> None:
        """Send each item of `steps` to the stream's one sink, on a thread of the pool, until it
        runs out, raises, or the stream is cancelled."""

        def work(sink: StreamSink) -> None:
            for item in steps:
                if sink.cancelled:
                    break
                sink.deliver(item)

        cls.on_thread(sinks, work)


class EmbeddingService(EngineService):
    """An embedding model's engine in its worker."""

    calls = frozenset({"tokenize", "embed", "tokenize_queries", "embed_images"})

    def __init__(self, engine: Embedder) -> None:
        self._engine = engine

    def facts(self) -> EncoderInfo:
        """The engine's info."""
        return self._engine.info

    def tokenize(self, texts: list[str]) -> list[list[int]]:
        """Each text's token ids."""
        return self._engine.tokenize(texts)

    def embed(self, batch: list[list[int]]) -> list[np.ndarray]:
        """Each input's vector (or per-token matrix), one batch."""
        return self._engine.embed(batch)

    def tokenize_queries(self, texts: list[str]) -> list[list[int]]:
        """Each text's token ids as a query (the same as a document's but for a
        late-interaction model)."""
        if isinstance(self._engine, TakesQueries):
            return self._engine.tokenize_queries(texts)
        return self._engine.tokenize(texts)

    def embed_images(self, images: list[EncodedImage]) -> list[np.ndarray | Unreadable]:
        """Each image's vector, one batch (an image-text model's)."""
        if not isinstance(self._engine, EmbedsImages):
            raise ValueError("the model takes no images")
        return self._engine.embed_images(images)

    def close(self) -> None:
        """Free the weights."""
        self._engine.close()


class RerankService(EngineService):
    """A reranker's engine in its worker."""

    calls = frozenset({"tokenize_pairs", "score"})

    def __init__(self, engine: Reranker) -> None:
        self._engine = engine

    def facts(self) -> EncoderInfo:
        """The engine's info."""
        return self._engine.info

    def tokenize_pairs(self, query: str, documents: list[str]) -> list[list[int]]:
        """Each (query, document) pair's token ids."""
        return self._engine.tokenize_pairs(query, documents)

    def score(self, batch: list[list[int]]) -> list[float]:
        """Each pair's relevance logit, one batch."""
        return self._engine.score(batch)

    def close(self) -> None:
        """Free the weights."""
        self._engine.close()


class TranscriptionService(EngineService):
    """A speech-to-text model's engine in its worker."""

    calls = frozenset({"speech_probabilities"})
    streams = frozenset({"transcribe"})

    def __init__(self, engine: Transcriber) -> None:
        self._engine = engine

    def facts(self) -> TranscriberFacts:
        """Whether it translates, and how many transcriptions it runs side by side."""
        return TranscriberFacts(self._engine.multilingual, self._engine.parallel)

    def transcribe(self, sinks: Sequence[StreamSink], job: TranscribeJob) -> None:
        """The info, then each segment as it is decoded."""
        steps: Iterator[TranscriptInfo | Segment] = self._engine.transcribe(job)
        self.iterate(sinks, steps)

    def speech_probabilities(self, samples: np.ndarray, context: np.ndarray | None) -> np.ndarray:
        """Silero's probability of speech per 32 ms window (a realtime session's turns)."""
        return speech_probabilities(samples, context)

    def close(self) -> None:
        """Free the weights."""
        self._engine.close()


class SpeechService(EngineService):
    """A text-to-speech model's engine in its worker."""

    streams = frozenset({"speak"})

    def __init__(self, engine: Synthesizer) -> None:
        self._engine = engine

    def facts(self) -> SynthesizerFacts:
        """Its sample rate and voices."""
        engine = self._engine
        return SynthesizerFacts(engine.sample_rate, engine.default_voice, tuple(engine.voices()))

    def speak(self, sinks: Sequence[StreamSink], job: SpeechJob, fmt: SpeechFormat) -> None:
        """The file in `fmt`, a piece as each sentence is synthesised and encoded (on the same
        thread), then the encoder's last bytes."""
        self.iterate(sinks, _encoded(self._engine, job, fmt))

    def close(self) -> None:
        """Free the weights."""
        self._engine.close()


def _encoded(engine: Synthesizer, job: SpeechJob, fmt: SpeechFormat) -> Iterator[bytes]:
    """The file in `fmt` as it is encoded; a compressed format is fed 0.2 s at a time, so its
    first bytes go once a fifth of a second is encoded, not a whole sentence (mp3's encoder
    is slower than the voice, 151 ms against 76 ms for 21 s of speech here: its first bytes
    came 23 ms after their sentence, now 2.3 ms). Raw pcm and wav go a sentence at a time.
    Nothing at all when the voice said nothing (a wav's bare header would be a file of no
    sound, and mp3's encoder leaves no bytes), so every format is answered alike."""
    encoder = AudioEncoder(fmt, engine.sample_rate, streaming=True)
    step = engine.sample_rate // 5
    said = False
    for samples in engine.synthesize(job):
        if not samples.size:
            continue
        said = True
        parts = (
            [samples]
            if fmt in ("pcm", "wav")
            else np.split(samples, range(step, samples.size, step))
        )
        for part in parts:
            piece = encoder.feed(part)
            if piece:
                yield piece
    last = encoder.finish()
    if last and said:
        yield last


class ImageService(EngineService):
    """An image model's pipeline in its worker; the HTTP process's queue sends it one batch at
    a time."""

    streams = frozenset({"generate"})

    def __init__(self, engine: ImageGenerator) -> None:
        self._engine = engine

    def facts(self) -> ImageModelInfo:
        """Sizes, defaults and the edits the model does."""
        return self._engine.info

    def generate(self, sinks: Sequence[StreamSink], job: ImageJob) -> None:
        """Each step's progress and previews, then the result; a cancelled stream ends with
        GenerationCancelled at the next step."""

        def work(sink: StreamSink) -> None:
            sink.deliver(self._engine.generate(job, sink.deliver, lambda: sink.cancelled))

        self.on_thread(sinks, work)

    def close(self) -> None:
        """Free the weights."""
        self._engine.close()


def open_model_service(
    config: ModelConfig,
) -> EmbeddingService | RerankService | TranscriptionService | SpeechService | ImageService:
    """Open the engine of an embedding, rerank, transcription, speech or image model."""
    if config.kind == "image":
        return ImageService(open_image_generator(config))
    if config.kind == "transcription":
        return TranscriptionService(open_transcriber(config.model, config.threads, config.parallel))
    if config.kind == "speech":
        return SpeechService(open_synthesizer(config.model, config.threads, config.parallel))
    options = EncoderOptions(
        config.threads, config.embedding_batch_tokens, config.ctx_size, config.embedding_engine
    )
    embeds = config.kind == "embedding"
    with progress(f"loading {config.model.name}"):
        service: EmbeddingService | RerankService = (
            EmbeddingService(open_embedder(config.model, options))
            if embeds
            else RerankService(open_reranker(config.model, options))
        )
    info = service.facts()
    logger.info(
        "serving %s as '%s' (%s, %d tokens at most)",
        "embeddings" if embeds else "reranking",
        config.served_name,
        info.engine,
        info.max_tokens,
    )
    return service
