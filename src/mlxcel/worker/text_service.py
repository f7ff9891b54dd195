"""A text-generation model as its worker process serves it (`worker/main.py`'s `Service`).

`TextService` loads the engine, tells the HTTP process its facts once, answers the calls
`tokenize`, `token_pieces`, `tokenize_with_media`, `score_prompt`, `slots` and `stop`, and
streams `generate`
and `generate_with_media`: the scheduler's token events for every sequence of one request,
admitted whole or not at all. The HTTP process's side is `models/textgen.py`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from mlxcel.config.engines import backend_label
from mlxcel.config.settings import ModelConfig
from mlxcel.engine.adapters import AdapterSet, LoraAdapters, SwitchesAdapters
from mlxcel.engine.capabilities import FillsInTheMiddle, ReportsDevices, ReportsKvCache
from mlxcel.engine.context import CONTEXT_LENGTH_EXCEEDED, context_overflow, longest_token
from mlxcel.engine.handle import TurnBatch, ends
from mlxcel.engine.media import TakesMedia
from mlxcel.engine.metrics import RecordsMetrics
from mlxcel.engine.scheduler import Admitted
from mlxcel.engine.slots import SlotReport
from mlxcel.engine.types import EngineError, MediaSpan, SamplingParams, TokenEvent, TokenLogprob
from mlxcel.logs import current_request, request_scope
from mlxcel.media.audio import SentMedia, decoded
from mlxcel.media.policy import MediaError
from mlxcel.wire.facts import MEDIA_PROMPT_REFUSED, MediaPrompt, TextFacts, TextSequence
from mlxcel.worker.loader import OnBroken, TextEngine, load_text_engine
from mlxcel.worker.outbox import CALL_THREADS, StreamSink

logger = logging.getLogger(__name__)

# Where media prompts are laid out (tokenized, their images embedded: 23 ms for a 512x512
# image on a small projector here), off the thread that reads the HTTP process's messages,
# which a cancellation must not wait behind; as many at once as calls.
_LAYOUTS = ThreadPoolExecutor(CALL_THREADS, thread_name_prefix="layout")


class TextService:
    """A text model's engine in its worker."""

    calls = frozenset(
        {
            "tokenize",
            "token_pieces",
            "tokenize_with_media",
            "score_prompt",
            "slots",
            "slot_file",
            "stop",
            "load_adapter",
            "unload_adapter",
            "prompt_cache",
        }
    )
    streams = frozenset({"generate", "generate_with_media"})

    def __init__(self, config: ModelConfig, engine: TextEngine) -> None:
        self._config = config
        self._engine = engine

    @classmethod
    def open(
        cls, config: ModelConfig, metrics: RecordsMetrics, on_broken: OnBroken, batch: TurnBatch
    ) -> TextService:
        """Load the model and start its engine, whose thread sends each turn's deliveries
        through `batch`."""
        return cls(config, load_text_engine(config, metrics, on_broken, batch))

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
            generator.devices if isinstance(generator, ReportsDevices) else (),
            engine.scheduler.scoring.able,
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
        self, text: str, media: list[SentMedia]
    ) -> tuple[list[int], tuple[MediaSpan, ...]]:
        """A prompt's tokens with its images and clips laid out (to count them), and their
        spans without their embedding rows: a 512x512 image's 256 rows are 590 KB."""
        tokens, spans = self._laid_out(text, media)
        emptied = [replace(s, embeddings=np.empty((len(s.embeddings), 0))) for s in spans]
        return tokens, tuple(emptied)

    def _laid_out(
        self, text: str, media: Sequence[SentMedia]
    ) -> tuple[list[int], tuple[MediaSpan, ...]]:
        """The generator's layout of a prompt, its images decoded here first; an image that
        does not decode is the request's fault (an EngineError naming its field)."""
        generator = self._engine.generator
        if not isinstance(generator, TakesMedia):
            raise ValueError("this model does not read images or audio")
        try:
            read = decoded(media)
        except MediaError as exc:
            raise EngineError(exc.message, exc.code, exc.param) from exc
        return generator.tokenize_with_media(text, read)

    def score_prompt(
        self, tokens: list[int], top_n: int, adapters: AdapterSet
    ) -> list[TokenLogprob]:
        """Each prompt token's log-probability after those before it, from the second on,
        with its `top_n` rivals, scored between two steps in a free slot (engine/scoring.py)."""
        request = current_request()
        request_id = request.request_id if request else ""
        return self._engine.scheduler.scoring.submit(tokens, top_n, adapters, request_id).result()

    def slots(self) -> list[SlotReport]:
        """The scheduler's snapshot for /slots."""
        return self._engine.scheduler.slots()

    def load_adapter(self, name: str, path: str) -> None:
        """Load a LoRA adapter over the model, between two steps; the base stays as it is."""
        lora = self._lora("lora_path")
        try:
            self._engine.scheduler.call(lambda: lora.load(name, Path(path))).result()
        except ValueError as exc:
            raise EngineError(str(exc), "invalid_request_error", "lora_path") from exc

    def unload_adapter(self, name: str) -> None:
        """Free a LoRA adapter; EngineError(code='adapter_in_use') while sequences use it."""
        lora, scheduler = self._lora("lora_name"), self._engine.scheduler

        def unload() -> None:
            if name not in lora.names:
                raise EngineError(f"no LoRA adapter '{name}' is loaded", "not_found", "lora_name")
            if name in scheduler.adapters_in_use():
                message = f"the LoRA adapter '{name}' is in use by running or waiting requests"
                raise EngineError(message, "adapter_in_use", "lora_name")
            lora.unload(name)

        scheduler.call(unload).result()

    def _lora(self, param: str) -> LoraAdapters:
        generator = self._engine.generator
        if not isinstance(generator, SwitchesAdapters):
            raise EngineError(
                "this model's engine runs no LoRA adapters", "invalid_request_error", param
            )
        return generator.lora

    def slot_file(self, action: str, slot: int, filename: str) -> dict[str, Any]:
        """llama-server's slot save, restore or erase (slot_files.py), once the slot is free."""
        files = self._engine.slot_files
        if files is None:
            message = "this model's KV state cannot be saved: no slot files"
            raise EngineError(message, "not_supported")
        if not 0 <= slot < self._engine.generator.n_slots:
            raise EngineError(f"Invalid slot ID: {slot}", "invalid_request_error")
        work = partial(files.run, action, slot, filename)
        return dict(self._engine.scheduler.when_idle(slot, work).result())

    def prompt_cache(self) -> dict[str, Any]:
        """The prompt cache's tiers as /props shows them (empty without one)."""
        tiers = self._engine.prompt_cache
        return {} if tiers is None else tiers.stats()

    def stop(self) -> None:
        """End every running and waiting generation with a shutdown error."""
        self._engine.scheduler.stop()

    def generate(self, sinks: Sequence[StreamSink], sequences: Sequence[TextSequence]) -> None:
        """Queue the sequences of one request, whose events go to `sinks`, all or none; no
        room for all raises."""
        self._engine.scheduler.submit(
            [
                (sink, tokens, params, ())
                for sink, (tokens, params) in zip(sinks, sequences, strict=True)
            ]
        )

    def generate_with_media(
        self, sinks: Sequence[StreamSink], prompt: MediaPrompt, params: list[SamplingParams]
    ) -> None:
        """Lay out a media prompt, then queue one sequence of it for each of `params` (whose
        events go to `sinks`) as `generate` does, on a layout thread. Its rows never leave this
        process, and its generation starts here, not after a reply went to the HTTP process
        and a request came back (2 ms of hops and wake-ups, against 23 ms of embedding). What
        the HTTP process checks of a tokenized prompt is checked here: a prompt refused is
        each sink's only event."""
        _LAYOUTS.submit(self._lay_out, sinks, prompt, params)

    def _lay_out(
        self, sinks: Sequence[StreamSink], prompt: MediaPrompt, params: list[SamplingParams]
    ) -> None:
        with request_scope(sinks[0].request_id):
            try:
                self._engine.scheduler.submit(self._admitted(sinks, prompt, params))
                return
            except EngineError as exc:
                refusal = exc
            except Exception as exc:
                logger.exception("laying out a prompt with media failed")
                refusal = EngineError(str(exc) or type(exc).__name__)
        for sink in sinks:
            sink.deliver(TokenEvent("", (), error=refusal))

    def _admitted(
        self, sinks: Sequence[StreamSink], prompt: MediaPrompt, params: list[SamplingParams]
    ) -> list[Admitted]:
        """The sequences of a media prompt, each one's answer held to the room it leaves."""
        try:
            tokens, spans = self._laid_out(prompt.text, prompt.media)
        except EngineError as exc:
            if exc.param is not None:
                raise  # an image that does not decode: its own 400, naming its field
            raise EngineError(str(exc), MEDIA_PROMPT_REFUSED) from exc
        n_ctx = self._engine.generator.n_ctx_seq
        overflow = context_overflow(len(tokens), n_ctx)
        if overflow is not None:
            raise EngineError(overflow, CONTEXT_LENGTH_EXCEEDED)
        room = n_ctx - len(tokens)
        return [
            (sink, tokens, replace(p, max_tokens=min(p.max_tokens, room)), spans)
            for sink, p in zip(sinks, params, strict=True)
        ]

    def is_last(self, item: Any) -> bool:
        """Whether a token event ends its generation."""
        assert isinstance(item, TokenEvent)
        return ends(item)

    def close(self) -> None:
        """Stop the engine thread (running requests end with an error)."""
        self._engine.scheduler.stop()
