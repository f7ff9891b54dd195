"""A text-generation model as its worker process serves it (`models/worker.py`'s `Service`).

`TextService` loads the engine, tells the HTTP process its facts once, answers the calls
`tokenize`, `token_pieces`, `tokenize_with_media`, `slots` and `stop`, and streams `generate`:
the scheduler's token events for every sequence of one request, admitted whole or not at all.
The HTTP process's side is `models/textgen.py`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from mlxcel.config import ModelConfig
from mlxcel.engine.capabilities import FillsInTheMiddle, ReportsKvCache
from mlxcel.engine.handle import ends
from mlxcel.engine.media import ImageRows, TakesMedia, rows_key
from mlxcel.engine.metrics import RecordsMetrics
from mlxcel.engine.slots import SlotState
from mlxcel.engine.types import EngineError, MediaSpan, TokenEvent
from mlxcel.media.audio import Media
from mlxcel.models.loader import TextEngine, backend_label, load_text_engine
from mlxcel.models.textgen import MODEL_UNAVAILABLE, TextFacts, TextSequence
from mlxcel.models.worker import StreamSink
from mlxcel.serving.tokens import longest_token


class TextService:
    """A text model's engine in its worker."""

    calls = frozenset({"tokenize", "token_pieces", "tokenize_with_media", "slots", "stop"})
    streams = frozenset({"generate"})

    def __init__(self, config: ModelConfig, engine: TextEngine) -> None:
        self._config = config
        self._engine = engine
        self._kept = ImageRows()
        """The embedding rows of the media spans `tokenize_with_media` answered, by digest and
        length, until the generation that names them: the HTTP process gets each span with no
        rows (it only places them), and `generate` puts them back."""

    @classmethod
    def open(cls, config: ModelConfig, metrics: RecordsMetrics) -> TextService:
        """Load the model and start its engine."""
        return cls(config, load_text_engine(config, metrics))

    def facts(self) -> TextFacts:
        """What the HTTP process needs to serve the model."""
        engine, generator = self._engine, self._engine.generator
        fim = generator.fim_tokens if isinstance(generator, FillsInTheMiddle) else None
        marker, rate = None, None
        if len(generator.input_modalities) > 1 and isinstance(generator, TakesMedia):
            marker, rate = generator.media_marker, generator.audio_rate
        kv_cache = generator.kv_cache if isinstance(generator, ReportsKvCache) else None
        return TextFacts(
            backend_label(self._config),
            generator.n_ctx_seq,
            generator.n_vocab,
            generator.n_slots,
            generator.batched,
            generator.max_feed_tokens,
            generator.chat_template,
            dict(generator.generation_config),
            generator.add_bos,
            tuple(generator.input_modalities),
            marker,
            fim,
            engine.defaults,
            engine.chat_template,
            engine.tool_call_parser,
            kv_cache,
            longest_token(generator),
            rate,
        )

    def tokenize(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        """Token ids for `text`."""
        return self._engine.generator.tokenize(
            text, add_special=add_special, parse_special=parse_special
        )

    def token_pieces(self, tokens: list[int], special: bool) -> list[bytes]:
        """The bytes each token stands for."""
        return self._engine.generator.token_pieces(tokens, special=special)

    def tokenize_with_media(
        self, text: str, media: list[Media]
    ) -> tuple[list[int], tuple[MediaSpan, ...]]:
        """A prompt's tokens with its images and clips laid out, and their spans without their
        embedding rows, which stay here for the generation: a 512x512 image's 256 rows are
        590 KB, which took 0.5-0.8 ms each way to the HTTP process and back."""
        generator = self._engine.generator
        if not isinstance(generator, TakesMedia):
            raise ValueError("this model does not read images or audio")
        tokens, spans = generator.tokenize_with_media(text, media)
        return tokens, tuple(self._keep(span) for span in spans)

    def _keep(self, span: MediaSpan) -> MediaSpan:
        rows = span.embeddings
        self._kept.put(rows_key(span.digest, len(rows)), rows)
        return replace(span, embeddings=np.empty((len(rows), 0), rows.dtype))

    def _restored(self, span: MediaSpan) -> MediaSpan:
        if span.embeddings.size or not len(span.embeddings):
            return span
        rows = self._kept.get(rows_key(span.digest, len(span.embeddings)))
        if rows is None:
            raise EngineError(
                "an image or audio clip of the request was embedded but dropped before its "
                "generation began (more media at once than the model keeps); retry the request",
                MODEL_UNAVAILABLE,
            )
        return replace(span, embeddings=rows)

    def slots(self) -> list[tuple[SlotState, int, int]]:
        """The scheduler's snapshot for /slots."""
        return self._engine.scheduler.slots()

    def stop(self) -> None:
        """End every running and waiting generation with a shutdown error."""
        self._engine.scheduler.stop()

    def generate(self, sinks: Sequence[StreamSink], sequences: Sequence[TextSequence]) -> None:
        """Queue the sequences of one request, whose events go to `sinks`, all or none (with
        the rows of their media spans put back); no room for all raises."""
        self._engine.scheduler.submit(
            [
                (sink, tokens, params, tuple(self._restored(span) for span in spans))
                for sink, (tokens, params, spans) in zip(sinks, sequences, strict=True)
            ]
        )

    def is_last(self, item: Any) -> bool:
        """Whether a token event ends its generation."""
        assert isinstance(item, TokenEvent)
        return ends(item)

    def close(self) -> None:
        """Stop the engine thread (running requests end with an error)."""
        self._engine.scheduler.stop()
