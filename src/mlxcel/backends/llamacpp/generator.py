"""A GGUF model on llama.cpp, stepping several sequences in one llama_decode."""

from __future__ import annotations

import ctypes
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import llama_cpp
import llguidance
import numpy as np
from llguidance.llamacpp import lltokenizer_from_vocab

from mlxcel.backends.guidance import constraint, held_by_guidance
from mlxcel.backends.llamacpp import drafting, native
from mlxcel.backends.llamacpp.embedding_batch import decode_rows
from mlxcel.backends.llamacpp.kv_cache import kv_cache_info
from mlxcel.backends.llamacpp.lora import LlamaAdapters
from mlxcel.backends.llamacpp.model import (
    LlamaCppOptions,
    load_model,
    new_context,
    read_chat_template,
    read_fim_tokens,
    read_generation_config,
)
from mlxcel.backends.llamacpp.sampling import build_chain
from mlxcel.backends.llamacpp.scoring import score_into
from mlxcel.backends.llamacpp.slot_sampler import SlotSampler
from mlxcel.backends.llamacpp.vision import Projector
from mlxcel.engine.capabilities import DeviceInfo, FimTokens, KvCacheInfo
from mlxcel.engine.positions import Jumps, MropePositions
from mlxcel.engine.speculative import DraftCosts
from mlxcel.engine.types import ChatTemplate, Feed, MediaSpan, Sample, SamplingParams
from mlxcel.media.audio import Media

# The calls the engine thread makes for every token (native.holding_gil says why).
_memory_seq_rm = native.holding_gil("llama_memory_seq_rm")


class LlamaCppGenerator:
    """TextGenerator over llama-cpp-python's low-level API; one KV sequence per slot."""

    def __init__(self, path: Path, options: LlamaCppOptions) -> None:
        native.route_native_logs(options.verbose)
        llama_cpp.llama_backend_init()
        model, self._devices = load_model(path, options)
        self._model = model
        self._vocab = llama_cpp.llama_model_get_vocab(model)
        self._ctx = new_context(model, options)
        self._memory = llama_cpp.llama_get_memory(self._ctx)
        self._lora = LlamaAdapters(model, self._ctx)
        cells = int(llama_cpp.llama_n_ctx(self._ctx))
        self._kv_cache = kv_cache_info(model, cells, options.cache_type_k, options.cache_type_v)
        self._n_slots = options.parallel
        # A recurrent model's state is no KV buffer that one sequence's copy could trim.
        recurrent = llama_cpp.llama_model_is_recurrent(model) or llama_cpp.llama_model_is_hybrid(
            model
        )
        self._shares_prefixes = options.parallel > 1 and not recurrent
        self._max_feed = llama_cpp.llama_n_batch(self._ctx)
        self._batch = llama_cpp.llama_batch_init(self._max_feed, 0, 1)
        self._slots: dict[int, SlotSampler] = {}
        self._n_past = [0] * options.parallel
        """Each slot's next KV position: its token count until an M-RoPE image."""
        self._jumps = [Jumps() for _ in range(options.parallel)]
        """Each slot's map from token index to position (they differ after M-RoPE images)."""
        self._pieces: dict[int, bytes] = {}
        self._tokenizer: llguidance.LLTokenizer | None = None
        self._n_vocab = int(llama_cpp.llama_vocab_n_tokens(self._vocab))
        self._eog = tuple(
            t for t in range(self._n_vocab) if llama_cpp.llama_vocab_is_eog(self._vocab, t)
        )
        self._eog_set = frozenset(self._eog)
        self._n_ctx_seq = int(llama_cpp.llama_n_ctx_seq(self._ctx))
        self._chat_template = read_chat_template(model, self._vocab)
        self._generation_config = read_generation_config(model)
        self._fim_tokens = read_fim_tokens(self._vocab)
        self._draft_model: drafting.DraftModel | None = None
        if options.model_draft is not None:
            try:
                self._draft_model = drafting.DraftModel(options.model_draft, options, self._vocab)
            except ValueError:
                self._free()
                raise
        self._projector: Projector | None = None
        if options.mmproj is not None:
            self._projector = Projector(
                options.mmproj, model, options.threads, use_gpu=options.n_gpu_layers != 0
            )

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
    def max_feed_tokens(self) -> int:
        return self._max_feed

    @property
    def chat_template(self) -> ChatTemplate | None:
        return self._chat_template

    @property
    def generation_config(self) -> Mapping[str, float]:
        return self._generation_config

    @property
    def lora(self) -> LlamaAdapters:
        return self._lora

    @property
    def kv_cache(self) -> KvCacheInfo:
        return self._kv_cache

    @property
    def devices(self) -> tuple[DeviceInfo, ...]:
        return self._devices

    @property
    def fim_tokens(self) -> FimTokens:
        return self._fim_tokens

    @property
    def add_bos(self) -> bool:
        return bool(llama_cpp.llama_vocab_get_add_bos(self._vocab))

    @property
    def input_modalities(self) -> tuple[str, ...]:
        """What a prompt may hold: text, and what the projector encodes."""
        return ("text",) if self._projector is None else ("text", *self._projector.modalities)

    @property
    def media_marker(self) -> str:
        if self._projector is None:
            raise ValueError("this model has no projector")
        return self._projector.marker

    @property
    def audio_rate(self) -> int | None:
        return None if self._projector is None else self._projector.audio_rate

    def tokenize_with_media(
        self, text: str, media: Sequence[Media]
    ) -> tuple[list[int], tuple[MediaSpan, ...]]:
        if self._projector is None:
            raise ValueError("this model has no projector")
        return self._projector.tokenize(text, media, self._max_feed)

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        return native.tokenize(
            self._vocab, text.encode(), add_special=add_special, parse_special=parse_special
        )

    def token_bytes(self, token: int, *, special: bool = False) -> bytes:
        if special:
            return native.token_piece(self._vocab, token, special=True)
        piece = self._pieces.get(token)
        if piece is None:
            piece = native.token_piece(self._vocab, token, special=False)
            self._pieces[token] = piece
        return piece

    def token_pieces(self, tokens: Sequence[int], *, special: bool = False) -> list[bytes]:
        return [self.token_bytes(t, special=special) for t in tokens]

    def is_end_of_generation(self, token: int) -> bool:
        return token in self._eog_set

    def open_slot(self, slot: int, params: SamplingParams, *, reuse: int = 0) -> None:
        self.close_slot(slot)
        kept = self._jumps[slot].position(reuse)
        llama_cpp.llama_memory_seq_rm(self._memory, slot, kept, -1)
        self._n_past[slot] = kept
        self._jumps[slot].keep(reuse)
        banned: tuple[int, ...] = ()
        if params.ignore_eos:
            banned = self._eog
        elif params.min_tokens > 0:
            banned = self._eog + params.stop_token_ids
        guided = None
        if held_by_guidance(params):
            guided = constraint(params, self._guidance_tokenizer(), self._n_vocab)
        chain = build_chain(self._vocab, self._n_vocab, self.n_ctx_seq, params, banned)
        self._slots[slot] = SlotSampler(
            params, chain, banned, guided, self._n_vocab, self._eog[0], self._rebuild_chain
        )

    def _rebuild_chain(self, params: SamplingParams) -> Any:
        return build_chain(self._vocab, self._n_vocab, self.n_ctx_seq, params)

    def _guidance_tokenizer(self) -> llguidance.LLTokenizer:
        """llguidance's view of the vocabulary, built on the first request that needs it."""
        if self._tokenizer is None:
            eos = list(self._eog) or None
            self._tokenizer = lltokenizer_from_vocab(self._vocab, self._n_vocab, eos_token=eos)
        return self._tokenizer

    @property
    def can_save_state(self) -> bool:
        return True

    def save_state(self, slot: int) -> bytes:
        size = llama_cpp.llama_state_seq_get_size(self._ctx, slot)
        buffer = (ctypes.c_uint8 * size)()
        written = llama_cpp.llama_state_seq_get_data(self._ctx, buffer, size, slot)
        # The slot's positions after M-RoPE images go first.
        return self._jumps[slot].to_bytes() + ctypes.string_at(buffer, written)

    def load_state(self, slot: int, data: bytes) -> bool:
        llama_cpp.llama_memory_seq_rm(self._memory, slot, -1, -1)
        self._jumps[slot], size = Jumps.from_bytes(data)
        state = data[size:]
        buffer = (ctypes.c_uint8 * len(state)).from_buffer_copy(state)
        loaded = llama_cpp.llama_state_seq_set_data(self._ctx, buffer, len(state), slot)
        return loaded == len(state)

    @property
    def batched(self) -> bool:
        return True  # one llama_decode over every sequence's tokens

    @property
    def shares_prefixes(self) -> bool:
        return self._shares_prefixes

    def copy_slot(self, source: int, slot: int) -> None:
        # Each slot is a stream of its own (no unified KV cache): llama.cpp copies the whole
        # buffer, at the next decode, and open_slot trims the copy.
        llama_cpp.llama_memory_seq_rm(self._memory, slot, -1, -1)
        llama_cpp.llama_memory_seq_cp(self._memory, source, slot, -1, -1)
        self._jumps[slot] = Jumps.from_bytes(self._jumps[source].to_bytes())[0]

    def close_slot(self, slot: int) -> None:
        state = self._slots.pop(slot, None)
        if state is not None:
            llama_cpp.llama_sampler_free(state.chain)

    @property
    def verifies_drafts(self) -> bool:
        return True

    def draft_costs(self, lengths: Sequence[int]) -> DraftCosts:
        return drafting.draft_costs(self._ctx, self._batch, self._memory, 0, lengths)

    @property
    def drafts_with_model(self) -> bool:
        return self._draft_model is not None

    def draft(self, requests: Sequence[drafting.DraftRequest]) -> list[tuple[int, ...]]:
        if self._draft_model is None:
            raise ValueError("this model has no draft model")
        return self._draft_model.draft(requests)

    @property
    def scores_prompts(self) -> bool:
        return True

    def score_prompt(self, slot: int, tokens: Sequence[int], top_n: int) -> list[Sample]:
        """The prompt's scores (scoring.py), evaluated into the slot, which then holds it."""
        self.close_slot(slot)
        self._jumps[slot] = Jumps()
        self._n_past[slot] = 0
        args = (self._ctx, self._memory, self._batch, self._max_feed, slot, tokens, top_n)
        scores = score_into(*args, self._n_vocab)
        self._n_past[slot] = len(tokens)
        return scores

    def step(self, feeds: Sequence[Feed]) -> list[Sample | None]:
        # Token feeds share one llama_decode; a feed with images decodes on its own after them,
        # an embedding batch per image (a llama_batch holds tokens or embeddings, not both).
        plain = [feed for feed in feeds if not feed.media]
        done = dict(zip(map(id, plain), self._step_tokens(plain), strict=True)) if plain else {}
        return [done[id(feed)] if id(feed) in done else self._step_media(feed) for feed in feeds]

    def _step_media(self, feed: Feed) -> Sample | None:
        index = -1
        pos = 0
        mrope = feed.mrope or (None,) * len(feed.media)
        images = [(at, rows, m) for (at, rows), m in zip(feed.media, mrope, strict=True)]
        for offset, rows, positions in (*images, (len(feed.tokens), None, None)):
            if offset > pos:
                last = rows is None
                text = Feed(feed.slot, feed.tokens[pos:offset], feed.sample and last)
                decoded = self._decode_tokens([text])[0]
                index = -1 if decoded is None else decoded
            if rows is not None:
                last = offset + len(rows) == len(feed.tokens)
                index = self._decode_embeddings(feed.slot, rows, feed.sample and last, positions)
                pos = offset + len(rows)
            else:
                pos = offset
        return self._sample(feed.slot, index) if feed.sample else None

    def _decode_embeddings(
        self, slot: int, rows: np.ndarray, logits: bool, mrope: MropePositions | None
    ) -> int:
        """Evaluate one image's rows at the slot's next positions (M-RoPE's four sections
        where it has them); the index of its last."""
        n = len(rows)
        start = self._n_past[slot]
        steps = np.arange(start, start + n, dtype=np.int32) if mrope is None else mrope.at(start)
        causal = self._projector is None or not self._projector.non_causal
        decode_rows(self._ctx, slot, rows, steps, logits=logits, causal=causal)
        n_pos = n if mrope is None else mrope.n_pos
        self._jumps[slot].advance(start, n, n_pos)
        self._n_past[slot] = start + n_pos
        return n - 1

    def _step_tokens(self, feeds: Sequence[Feed]) -> list[Sample | None]:
        outputs = self._decode_tokens(feeds)
        return [
            None if index is None else self._verify(feed, index)
            for feed, index in zip(feeds, outputs, strict=True)
        ]

    def _decode_tokens(self, feeds: Sequence[Feed]) -> list[int | None]:
        """One llama_decode of every feed's tokens; the batch index each feed samples at.

        The rows go in slot order: with a KV stream per slot, llama.cpp cuts a batch into
        micro-batches of consecutive sequence ids in the order the rows come (split_equal),
        and each micro-batch is a pass over all the weights; 8 decoding slots in admission
        order, say 3 0 1 2 7 4 5 6, took three passes where slot order takes one."""
        batch = self._batch
        n = 0
        outputs: list[int | None] = [None] * len(feeds)
        for k in sorted(range(len(feeds)), key=lambda k: feeds[k].slot):
            feed = feeds[k]
            start = self._n_past[feed.slot]
            last = len(feed.tokens) - 1
            for i, token in enumerate((*feed.tokens, *feed.draft)):
                native.put_token(batch, n, token, start + i, feed.slot, feed.sample and i >= last)
                n += 1
            self._n_past[feed.slot] = start + len(feed.tokens)
            if feed.sample:
                outputs[k] = n - 1 - len(feed.draft)
        drafting.decode(self._ctx, batch, n)
        return outputs

    def _verify(self, feed: Feed, index: int) -> Sample:
        """The sample after the feed's tokens and, while each equals the draft token there,
        the samples after those (speculative.py says why this is exact); the rejected draft
        tokens leave the KV state."""
        samples = [self._sample(feed.slot, index)]
        for offset, drafted in enumerate(feed.draft, start=1):
            if samples[-1].token != drafted or self.is_end_of_generation(drafted):
                break
            samples.append(self._sample(feed.slot, index + offset))
        accepted = len(samples) - 1
        kept = self._n_past[feed.slot] + accepted
        if accepted < len(feed.draft):
            _memory_seq_rm(self._memory, feed.slot, kept, -1)
        self._n_past[feed.slot] = kept
        if not feed.draft:
            return samples[0]
        return replace(samples[0], then=tuple(samples[1:]))

    def _sample(self, slot: int, index: int) -> Sample:
        return self._slots[slot].sample(self._ctx, index)

    def warm_up(self) -> None:
        """Run one token through the model so the first request does not pay for page-in."""
        bos = llama_cpp.llama_vocab_bos(self._vocab)
        self.open_slot(0, SamplingParams(max_tokens=1, temperature=0, top_p=1, top_k=0, min_p=0))
        self.step([Feed(0, (max(bos, 0),), True)])
        self.close_slot(0)
        llama_cpp.llama_memory_seq_rm(self._memory, 0, -1, -1)
        self._n_past[0] = 0
        self._jumps[0] = Jumps()

    def close(self) -> None:
        for slot in list(self._slots):
            self.close_slot(slot)
        self._lora.close()
        if self._projector is not None:
            self._projector.close()
        if self._draft_model is not None:
            self._draft_model.close()
        self._free()

    def _free(self) -> None:
        llama_cpp.llama_batch_free(self._batch)
        llama_cpp.llama_free(self._ctx)
        llama_cpp.llama_model_free(self._model)
