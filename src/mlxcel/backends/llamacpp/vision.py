"""A GGUF projector (mmproj) through libmtmd: prompts with images or audio clips, each window
embedded once."""

from __future__ import annotations

import ctypes
import hashlib
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import llama_cpp
import llama_cpp.mtmd_cpp as mtmd
import numpy as np
from llama_cpp import _logger as llama_logger

from mlxcel.engine.media import CACHE_IMAGES, ImageRows, rows_key
from mlxcel.engine.positions import MropePositions
from mlxcel.engine.types import EngineError, MediaSpan
from mlxcel.media.audio import Audio, Media
from mlxcel.media.images import MEDIA_MARKER
from mlxcel.media.recent import Recent

# The stand-in for an image whose rows are cached: libmtmd preprocesses every image it is
# given (resized and normalised for the encoder, 1.2 ms of a 1.6 ms tokenization for a 512x512
# one here) even when its embedding is not needed again; a tiny one costs almost nothing.
STAND_IN_SIZE = 16


class Projector:
    """libmtmd's context for one model: tokenizes prompts with media and embeds them.

    Any thread may call `tokenize`; a lock keeps one call in libmtmd at a time, so embedding
    runs beside the engine thread's decoding instead of inside it. libmtmd turns an image into
    one chunk of tokens and an audio clip into one per window of its encoder (30 s for
    Whisper-style ones).
    """

    def __init__(self, path: Path, model: Any, threads: int, *, use_gpu: bool) -> None:
        mtmd.mtmd_log_set(llama_logger.llama_log_callback, ctypes.c_void_p(0))
        mtmd.mtmd_helper_log_set(llama_logger.llama_log_callback, ctypes.c_void_p(0))
        params = mtmd.mtmd_context_params_default()
        params.use_gpu = use_gpu
        params.n_threads = threads
        params.print_timings = False
        params.media_marker = MEDIA_MARKER.encode()
        ctx = mtmd.mtmd_init_from_file(str(path).encode(), model, params)
        if not ctx:
            raise ValueError(f"llama.cpp could not load the projector {path}: not an mmproj GGUF?")
        self._ctx = ctx
        self.modalities = tuple(
            kind
            for kind, supported in (
                ("image", mtmd.mtmd_support_vision(ctx)),
                ("audio", mtmd.mtmd_support_audio(ctx)),
            )
            if supported
        )
        """What the projector encodes: "image", "audio" or both."""
        if not self.modalities:
            self.close()
            raise ValueError(f"{path} is not a vision or audio projector (no encoder)")
        self.mrope = bool(mtmd.mtmd_decode_use_mrope(ctx))
        """Whether the model places media by M-RoPE positions (Qwen2-VL, Qwen2.5-VL, Qwen3-VL)."""
        self.audio_rate = int(mtmd.mtmd_get_audio_sample_rate(ctx)) if "audio" in self else None
        """Samples per second the audio encoder takes (None: it takes no audio)."""
        self.non_causal = bool(mtmd.mtmd_decode_use_non_causal(ctx, None))
        """Whether an image's tokens attend to each other both ways (Gemma 3)."""
        self.n_embd = int(llama_cpp.llama_model_n_embd(model))
        self.marker = MEDIA_MARKER
        self._lock = threading.Lock()
        self._cache = ImageRows()
        self._layouts: Recent[str, int] = Recent(4 * CACHE_IMAGES, 1 << 20, _key_size)
        """Token counts of recent images that were one chunk each, by digest."""
        self._stand_ins_fit = not self.mrope
        """Whether a cached image may be laid out from a stand-in: not where its positions
        depend on its size (M-RoPE), nor once a stand-in was laid out otherwise than it."""

    def __contains__(self, modality: str) -> bool:
        return modality in self.modalities

    def tokenize(
        self, text: str, media: Sequence[Media], max_chunk_tokens: int
    ) -> tuple[list[int], tuple[MediaSpan, ...]]:
        """`text`'s tokens, each marker its medium's placeholders, and the media's spans."""
        for kind in ("image", "audio"):
            if kind not in self and any(_kind(m) == kind for m in media):
                raise EngineError(f"model does not support {kind} input", "invalid_request")
        with self._lock:
            stand_ins = self._cached(media)
            if stand_ins:
                try:
                    laid_out = self._laid_out(text, media, max_chunk_tokens, stand_ins)
                except EngineError:
                    laid_out = None  # the images themselves say what is wrong, if anything
                else:
                    if laid_out is not None:
                        return laid_out
                    self._stand_ins_fit = False
            laid_out = self._laid_out(text, media, max_chunk_tokens, {})
            assert laid_out is not None
            return laid_out

    def _cached(self, media: Sequence[Media]) -> dict[int, int]:
        """The images a stand-in may replace, with their token counts: one chunk each when
        last laid out, with their rows still cached."""
        if not self._stand_ins_fit:
            return {}
        known = {}
        for index, medium in enumerate(media):
            if isinstance(medium, Audio):
                continue
            n = self._layouts.get(medium.digest)
            if n is not None and self._cache.get(rows_key(medium.digest, n)) is not None:
                known[index] = n
        return known

    def _laid_out(
        self, text: str, media: Sequence[Media], max_chunk_tokens: int, stand_ins: dict[int, int]
    ) -> tuple[list[int], tuple[MediaSpan, ...]] | None:
        """`_tokenize` with the images of `stand_ins` given as stand-ins; None if one is not
        laid out as its image was (another token count, another chunk count, an error)."""
        bitmaps = [
            self._stand_in(index) if index in stand_ins else self._bitmap(index, medium)
            for index, medium in enumerate(media)
        ]
        chunks = mtmd.mtmd_input_chunks_init()
        try:
            return self._tokenize(text, media, bitmaps, chunks, max_chunk_tokens, stand_ins)
        finally:
            mtmd.mtmd_input_chunks_free(chunks)
            for bitmap in bitmaps:
                mtmd.mtmd_bitmap_free(bitmap)

    def _stand_in(self, index: int) -> Any:
        pixels = (ctypes.c_uint8 * (STAND_IN_SIZE * STAND_IN_SIZE * 3))()
        bitmap = mtmd.mtmd_bitmap_init(STAND_IN_SIZE, STAND_IN_SIZE, pixels)
        mtmd.mtmd_bitmap_set_id(bitmap, str(index).encode())
        return bitmap

    def _bitmap(self, index: int, medium: Media) -> Any:
        if isinstance(medium, Audio):
            n = len(medium.samples) // 4
            samples = (ctypes.c_float * n).from_buffer_copy(medium.samples)
            bitmap = mtmd.mtmd_bitmap_init_from_audio(n, samples)
        else:
            pixels = (ctypes.c_uint8 * len(medium.rgb)).from_buffer_copy(medium.rgb)
            bitmap = mtmd.mtmd_bitmap_init(medium.width, medium.height, pixels)
        # Each chunk carries its bitmap's id: which medium of the prompt it came from.
        mtmd.mtmd_bitmap_set_id(bitmap, str(index).encode())
        return bitmap

    def _tokenize(
        self,
        text: str,
        media: Sequence[Media],
        bitmaps: list[Any],
        chunks: Any,
        max_chunk_tokens: int,
        stand_ins: dict[int, int],
    ) -> tuple[list[int], tuple[MediaSpan, ...]] | None:
        encoded = text.encode()
        source = mtmd.mtmd_input_text()
        source.text, source.text_len = encoded, len(encoded)
        source.add_special, source.parse_special = True, True
        array = (mtmd.mtmd_bitmap_p_ctypes * max(1, len(bitmaps)))(*bitmaps)
        status = mtmd.mtmd_tokenize(self._ctx, chunks, ctypes.byref(source), array, len(bitmaps))
        if status == 1:
            raise EngineError(
                f"the prompt has {text.count(self.marker)} media markers for {len(media)} "
                "images and clips",
                "invalid_request",
            )
        if status != 0:
            raise EngineError(f"libmtmd could not preprocess the media (status {status})")
        tokens: list[int] = []
        spans: list[MediaSpan] = []
        windows = [0] * len(media)
        counts: dict[int, list[int]] = {}
        for i in range(mtmd.mtmd_input_chunks_size(chunks)):
            chunk = mtmd.mtmd_input_chunks_get(chunks, i)
            if mtmd.mtmd_input_chunk_get_type(chunk) == mtmd.MTMD_INPUT_CHUNK_TYPE_TEXT:
                n = ctypes.c_size_t(0)
                ids = mtmd.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n))
                tokens.extend(ids[k] for k in range(n.value))
                continue
            index = int(mtmd.mtmd_input_chunk_get_id(chunk) or b"0")
            n_tokens = int(mtmd.mtmd_input_chunk_get_n_tokens(chunk))
            counts.setdefault(index, []).append(n_tokens)
            # A clip's k-th window is named by the clip and k, and so is an image's k-th
            # chunk past its first: llava-uhd style projectors (MiniCPM-V, Idefics3, Llama 4)
            # cut a large image into an overview and slices of one size, which under the
            # image's own name would all find the first slice's rows in the cache.
            digest = media[index].digest
            part = windows[index]
            windows[index] += 1
            if isinstance(media[index], Audio) or part:
                digest = hashlib.sha256(f"{digest}:{part}".encode()).hexdigest()
            if index in stand_ins:
                if counts[index] != [stand_ins[index]]:
                    return None
                rows = self._cache.get(rows_key(digest, n_tokens))
                if rows is None:
                    return None
            else:
                rows = self._embed(chunk, digest, max_chunk_tokens)
            span = MediaSpan(len(tokens), rows, digest, _mrope(chunk) if self.mrope else None)
            spans.append(span)
            tokens.extend([span.placeholder] * len(rows))
        for index, medium in enumerate(media):
            if index not in stand_ins and not isinstance(medium, Audio):
                counted = counts.get(index, [])
                if len(counted) == 1:
                    self._layouts.put(medium.digest, counted[0])
        return tokens, tuple(spans)

    def _embed(self, chunk: Any, digest: str, max_chunk_tokens: int) -> np.ndarray:
        """A chunk's embedding rows: from the cache, else from the projector."""
        n_tokens = int(mtmd.mtmd_input_chunk_get_n_tokens(chunk))
        if n_tokens > max_chunk_tokens:
            raise EngineError(
                f"an image or audio window takes {n_tokens} tokens, more than one batch holds "
                f"({max_chunk_tokens}; raise --batch-size)",
                "invalid_request",
            )
        key = rows_key(digest, n_tokens)
        rows = self._cache.get(key)
        if rows is not None:
            return rows
        if mtmd.mtmd_encode_chunk(self._ctx, chunk) != 0:
            raise EngineError("the projector failed to embed an image or audio window")
        out = mtmd.mtmd_get_output_embd(self._ctx)
        flat = np.ctypeslib.as_array(out, shape=(n_tokens * self.n_embd,))
        rows = flat.reshape(n_tokens, self.n_embd).copy()
        self._cache.put(key, rows)
        return rows

    def close(self) -> None:
        """Free libmtmd's context."""
        if self._ctx:
            mtmd.mtmd_free(self._ctx)
            self._ctx = None


def _mrope(chunk: Any) -> MropePositions:
    """A chunk's M-RoPE positions: libmtmd's grid for an image (read with its first token at
    positions 0 and 1, which tells which sections move with the start), one position a token
    in every section for audio."""
    n = int(mtmd.mtmd_input_chunk_get_n_tokens(chunk))
    n_pos = int(mtmd.mtmd_input_chunk_get_n_pos(chunk))
    if mtmd.mtmd_input_chunk_get_type(chunk) != mtmd.MTMD_INPUT_CHUNK_TYPE_IMAGE:
        steps = np.broadcast_to(np.arange(n, dtype=np.int32), (4, n)).copy()
        return MropePositions(steps, np.ones((4, n), dtype=np.int32), n_pos)
    image = mtmd.mtmd_input_chunk_get_tokens_image(chunk)
    at = [_decoder_positions(image, n, start) for start in (0, 1)]
    return MropePositions(at[0], at[1] - at[0], n_pos)


def _decoder_positions(image: Any, n: int, start: int) -> np.ndarray:
    """libmtmd's (t, x, y, z) of each of an image's tokens as the text model's sections
    (temporal, row, column, unused), as its helper lays them out: int32 (4, n)."""
    out = (mtmd.mtmd_decoder_pos * n)()
    mtmd.mtmd_helper_image_get_decoder_pos(image, start, out)
    table = np.array([(p.t, p.y, p.x, p.z) for p in out], dtype=np.int64)
    return table.T.astype(np.int32)


def _key_size(digest: str, n_tokens: int) -> int:
    return len(digest)


def _kind(medium: Media) -> str:
    return "audio" if isinstance(medium, Audio) else "image"
