"""An MLX or Hugging Face safetensors model on mlx-lm: one KV cache per slot, decoded together."""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import KVCache, QuantizedKVCache, make_prompt_cache, trim_prompt_cache
from mlx_lm.utils import load_model, load_tokenizer

from mlxcel.backends.guidance import Constraint, constraint
from mlxcel.backends.mlx.batch import BatchedRows, DecodeRows, SingleRows, run, unbatchable
from mlxcel.backends.mlx.config import config_value, read_generation_config
from mlxcel.backends.mlx.dry import Dry, DrySettings
from mlxcel.backends.mlx.kv_state import from_bytes, to_bytes, trimmable, unsaveable
from mlxcel.backends.mlx.lora import MlxAdapters
from mlxcel.backends.mlx.sampling import SlotSampler, sample_rows
from mlxcel.backends.mlx.scoring import score_tokens
from mlxcel.backends.mlx.vocab import Vocabulary
from mlxcel.engine.positions import Jumps
from mlxcel.engine.types import ChatTemplate, Feed, Sample, SamplingParams

logger = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class MlxOptions:
    """How to serve an MLX model."""

    ctx_size: int
    parallel: int
    batch_size: int


@dataclass
class Slot:
    """One sequence's KV cache, the tokens it holds, and the sampler of its current request.

    `cache` is None while the cache is a row of the decode batch.
    """

    cache: list[Any] | None
    tokens: list[int] = field(default_factory=list)
    sampler: SlotSampler | None = None
    media: dict[int, np.ndarray] = field(default_factory=dict)
    """The embedding rows of the images among `tokens`, by the position of their first."""
    jumps: Jumps = field(default_factory=Jumps)
    """Where its positions stop being token indices (after M-RoPE images)."""


class MlxGenerator:
    """TextGenerator over mlx-lm: a step's sampled tokens go through the model in one pass.

    Prompt chunks are evaluated one sequence at a time into the slot's own cache; every
    sequence that samples in a step then feeds its last token into one batched forward pass
    (B x 1 tokens over the slots' caches merged into one batch cache), which keeps them as
    rows until they stop decoding. A model whose cache mlx-lm cannot batch (Llama 4's chunked
    attention) runs those rows one at a time instead; `batched` says which.

    Every MLX call runs on one worker thread the generator owns: MLX streams belong to the
    thread that made them, and that thread must clear them before it ends, or the process
    aborts at exit.
    """

    def __init__(self, path: Path, options: MlxOptions) -> None:
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mlx")
        self._slots: dict[int, Slot] = {}
        self._n_slots = options.parallel
        self._max_feed = options.batch_size
        try:
            self._load(path, options)
        except BaseException:
            self._call(mx.clear_streams)
            self._worker.shutdown(wait=True)
            raise

    def _open_model(self, path: Path) -> tuple[Any, dict[str, Any]]:
        """The model (token ids, a cache and optional input embeddings in; logits out) and
        its config."""
        model, config = load_model(path)
        return model, config

    def _read_vocabulary(self, path: Path, options: MlxOptions, config: Mapping[str, Any]) -> None:
        """The tokenizer, vocabulary, context per slot and chat template of the model folder
        whose config.json holds `config`."""
        eos = config_value(config, "eos_token_id")
        self._vocab = Vocabulary(load_tokenizer(path, eos_token_ids=eos))
        self._dry = DrySettings(self._vocab.tokens_containing)
        self._n_vocab = int(config_value(config, "vocab_size") or self._vocab.size)
        n_ctx = options.ctx_size or config_value(config, "max_position_embeddings")
        if not n_ctx:
            raise ValueError(f"{path} does not say its context length: pass -c/--ctx-size")
        self._n_ctx_seq = int(n_ctx) // options.parallel
        self._chat_template = self._vocab.chat_template()

    def _load(self, path: Path, options: MlxOptions) -> None:
        self._model, config = self._call(self._open_model, path)
        self._lora = MlxAdapters(lambda: self._model, self._call)
        self._read_vocabulary(path, options, config)
        fresh = self._call(make_prompt_cache, self._model)
        blocking = unbatchable(fresh)
        self._rows: DecodeRows = SingleRows() if blocking else BatchedRows()
        if blocking:
            logger.warning(
                "%s cannot be batched: sequences decode one at a time", ", ".join(blocking)
            )
        unsaved = unsaveable(fresh)
        self._can_save_state = not unsaved
        # A copy of a slot is cut back to the prefix a request shares; a window's or a
        # recurrent state cannot be, and would be evaluated again: no copy saves anything.
        plain = all(type(layer) in (KVCache, QuantizedKVCache) for layer in fresh)
        self._shares_prefixes = self.can_save_state and plain and options.parallel > 1
        if unsaved:
            logger.warning(
                "%s cannot be saved: no prompt cache in host memory or on disk (--cache-ram, "
                "--cache-disk); prompts are reused from the slots only",
                ", ".join(unsaved),
            )
        self._generation_config = read_generation_config(path)
        if self._call(mx.default_device).type == mx.DeviceType.cpu:
            logger.warning(
                "MLX runs on the CPU here, 20-100x slower than llama.cpp: "
                "serve a GGUF of this model for speed"
            )

    def _call(self, function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return self._worker.submit(function, *args, **kwargs).result()

    @property
    def n_ctx_seq(self) -> int:
        return self._n_ctx_seq

    @property
    def n_vocab(self) -> int:
        return self._n_vocab

    @property
    def n_slots(self) -> int:
        return self._n_slots

    @property
    def lora(self) -> MlxAdapters:
        return self._lora

    @property
    def max_feed_tokens(self) -> int:
        return self._max_feed

    @property
    def batched(self) -> bool:
        """Whether decoding sequences share one forward pass (else they run one at a time)."""
        return self._rows.batched

    @property
    def chat_template(self) -> ChatTemplate | None:
        return self._chat_template

    @property
    def generation_config(self) -> Mapping[str, float]:
        return self._generation_config

    @property
    def add_bos(self) -> bool:
        return self._vocab.add_bos

    @property
    def input_modalities(self) -> tuple[str, ...]:
        return ("text",)

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        return self._vocab.tokenize(text, add_special=add_special, parse_special=parse_special)

    def token_bytes(self, token: int, *, special: bool = False) -> bytes:
        return self._vocab.token_bytes(token, special=special)

    def token_pieces(self, tokens: Sequence[int], *, special: bool = False) -> list[bytes]:
        return [self.token_bytes(t, special=special) for t in tokens]

    def is_end_of_generation(self, token: int) -> bool:
        return token in self._vocab.end_of_generation

    def _constraint(self, params: SamplingParams) -> Constraint | None:
        if params.json_schema is None and params.grammar is None:
            return None
        return constraint(params, self._vocab.grammar_tokenizer(), self._n_vocab)

    def open_slot(self, slot: int, params: SamplingParams, *, reuse: int = 0) -> None:
        dry = self._dry.for_request(params, self._n_ctx_seq)
        grammar = self._constraint(params)
        self._call(self._open, slot, params, dry, grammar, reuse)

    def _open(
        self,
        slot: int,
        params: SamplingParams,
        dry: Dry | None,
        grammar: Constraint | None,
        reuse: int,
    ) -> None:
        state = self._kept_prefix(slot, reuse)
        state.sampler = SlotSampler(
            params,
            n_vocab=self._n_vocab,
            end_of_generation=sorted(self._vocab.end_of_generation),
            dry=dry,
            constraint=grammar,
        )
        self._slots[slot] = state

    def _kept_prefix(self, slot: int, reuse: int) -> Slot:
        """The slot's KV state cut back to its first `reuse` tokens."""
        state = self._slots.get(slot)
        if state is None or reuse == 0:
            self._forget(slot)
            return Slot(make_prompt_cache(self._model))
        cache = self._own_cache(slot)
        extra = len(state.tokens) - reuse
        # The scheduler never cuts inside an image: one starting before `reuse` stays whole.
        media = {start: rows for start, rows in state.media.items() if start < reuse}
        if extra > 0 and trimmable(cache):
            trim_prompt_cache(cache, extra)
        elif extra > 0:
            # Recurrent, sliding-window and chunked caches cannot drop tokens once they dropped
            # their front: evaluate the prefix again.
            prefix = state.tokens[:reuse]
            cache = make_prompt_cache(self._model)
            self._fill(cache, prefix, tuple(media.items()))
            state = Slot(cache, prefix)
        del state.tokens[reuse:]
        state.jumps.keep(reuse)
        state.media = media
        return state

    def _forget(self, slot: int) -> None:
        """Drop the slot's KV state; a row of it in the decode batch is never copied out."""
        if slot in self._rows.slots:
            self._rows.leave([slot])
        self._slots.pop(slot, None)

    @property
    def can_save_state(self) -> bool:
        """Whether `save_state` works: every kind of KV cache the model uses can be saved."""
        return self._can_save_state

    def save_state(self, slot: int) -> bytes:
        """The slot's KV state and the tokens it holds, as bytes."""
        return self._call(self._save_state, slot)

    @property
    def shares_prefixes(self) -> bool:
        """Whether `copy_slot` is worth it: every layer's cache is plain KV, which a copy's
        request cuts back to the prefix it shares."""
        return self._shares_prefixes

    def copy_slot(self, source: int, slot: int) -> None:
        """Slot `slot` holds what `source` holds, through a saved state."""
        self.load_state(slot, self.save_state(source))

    def _save_state(self, slot: int) -> bytes:
        state = self._slots[slot]
        return to_bytes(self._own_cache(slot), state.tokens, state.media, state.jumps)

    def load_state(self, slot: int, data: bytes) -> bool:
        """Replace the slot's KV state with saved bytes; MLX caches grow, so it always fits."""
        self._call(self._load_state, slot, data)
        return True

    def _load_state(self, slot: int, data: bytes) -> None:
        cache, tokens, media, jumps = from_bytes(data)
        self._hold(slot, Slot(cache, tokens, media=media, jumps=jumps))

    def _hold(self, slot: int, state: Slot) -> None:
        self._forget(slot)
        self._slots[slot] = state

    scores_prompts = True
    """Only a model whose forward takes token ids alone (the subclasses' do not)."""

    def score_prompt(self, slot: int, tokens: Sequence[int], top_n: int) -> list[Sample]:
        """scoring.py's scores; the slot takes the cache they were computed in."""
        cache, scores = self._call(score_tokens, self._model, tokens, top_n, self._max_feed)
        self._call(self._hold, slot, Slot(cache, list(tokens)))
        return scores

    def close_slot(self, slot: int) -> None:
        self._call(self._drop_sampler, slot)

    def _drop_sampler(self, slot: int) -> None:
        # The KV state stays: the next request may begin with the same tokens.
        state = self._slots.get(slot)
        if state is not None:
            state.sampler = None

    def step(self, feeds: Sequence[Feed]) -> list[Sample | None]:
        return self._call(self._step, feeds)

    def _step(self, feeds: Sequence[Feed]) -> list[Sample | None]:
        # A slot stays a row of the decode batch while it samples one token a step.
        staying = {f.slot for f in feeds if f.sample and len(f.tokens) == 1}
        self._take_back([slot for slot in self._rows.slots if slot not in staying])
        for feed in feeds:
            # The output projection over the whole vocabulary is paid for sampled tokens only.
            tokens = list(feed.tokens[:-1] if feed.sample else feed.tokens)
            if tokens:
                state = self._slots[feed.slot]
                at = self._prompt_positions(state, tokens, feed)
                self._fill(self._own_cache(feed.slot), tokens, feed.media, at)
                state.media.update((len(state.tokens) + at, rows) for at, rows in feed.media)
                state.tokens += tokens
        last = {f.slot: f.tokens[-1] for f in feeds if f.sample}
        if not last:
            return [None] * len(feeds)
        samplers = {slot: self._sampler(slot) for slot in last}
        joining = [slot for slot in last if slot not in self._rows.slots]
        self._rows.join({slot: self._own_cache(slot) for slot in joining})
        for slot in joining:
            self._slots[slot].cache = None
        rows = self._rows.slots
        positions = self._decode_positions([self._slots[slot] for slot in rows])
        logits = self._rows.forward(self._model, [last[slot] for slot in rows], positions)
        samples = sample_rows([samplers[slot] for slot in rows], logits)
        by_slot = dict(zip(rows, samples, strict=True))
        for slot, token in last.items():
            self._slots[slot].tokens.append(token)
        return [by_slot[f.slot] if f.sample else None for f in feeds]

    def _sampler(self, slot: int) -> SlotSampler:
        sampler = self._slots[slot].sampler
        if sampler is None:
            raise RuntimeError(f"slot {slot} was fed without being opened")
        return sampler

    def _own_cache(self, slot: int) -> list[Any]:
        """The slot's KV cache on its own, taken out of the decode batch if it is a row."""
        state = self._slots[slot]
        if state.cache is None:
            state.cache = self._take_back([slot])[slot]
        return state.cache

    def _take_back(self, slots: Collection[int]) -> dict[int, list[Any]]:
        """Move these slots' rows out of the decode batch into caches of their own."""
        caches = self._rows.leave(slots)
        # Evaluated now, so a slot kept for prefix reuse does not hold on to the whole batch.
        mx.eval([[layer.state for layer in cache] for cache in caches.values()])
        for slot, cache in caches.items():
            self._slots[slot].cache = cache
        return caches

    def _prompt_positions(self, state: Slot, tokens: list[int], feed: Feed) -> mx.array | None:
        """The position ids of a prompt chunk about to join the slot; None: the model counts
        them from its cache (one a token)."""
        return None

    def _decode_positions(self, rows: list[Slot]) -> mx.array | None:
        """The position ids of the decode rows' next tokens; None: from their caches."""
        return None

    def _fill(
        self,
        cache: list[Any],
        tokens: list[int],
        media: Sequence[tuple[int, np.ndarray]] = (),
        positions: mx.array | None = None,
    ) -> None:
        """Evaluate `tokens` into the KV cache only; MLX's lazy graph skips their logits.
        The images among them (offset, rows) are evaluated from their embedding rows."""
        embedded = self._model.embed(tokens, media) if media else None
        run(self._model, mx.array(tokens)[None], cache, positions, embedded)
        mx.eval([layer.state for layer in cache])

    def warm_up(self) -> None:
        """Run one token through the model so the first request does not pay for compiling."""
        self.open_slot(0, SamplingParams(max_tokens=1, temperature=0, top_p=1, top_k=0, min_p=0))
        self.step([Feed(0, self.tokenize("a", add_special=True, parse_special=False), True)])
        # Forget slot 0's KV state: the engine believes every slot starts out empty.
        self._call(self._forget, 0)

    def close(self) -> None:
        self._call(self._release)
        self._worker.shutdown(wait=True)

    def _release(self) -> None:
        self._slots.clear()
        self._rows.leave(self._rows.slots)
        del self._model
        mx.clear_streams()
