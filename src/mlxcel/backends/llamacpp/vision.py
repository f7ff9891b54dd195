"""A GGUF vision projector (mmproj) through libmtmd: prompts with images, embedded once each."""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import llama_cpp
import llama_cpp.mtmd_cpp as mtmd
import numpy as np
from llama_cpp import _logger as llama_logger

from mlxcel.engine.media import ImageRows
from mlxcel.engine.types import EngineError, MediaSpan
from mlxcel.media.images import MEDIA_MARKER, Image


class Projector:
    """libmtmd's context for one model: tokenizes prompts with images and embeds the images.

    Any thread may call `tokenize`; a lock keeps one call in libmtmd at a time, so embedding
    runs beside the engine thread's decoding instead of inside it.
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
        if not mtmd.mtmd_support_vision(ctx):
            self.close()
            raise ValueError(f"{path} is not a vision projector (no image encoder)")
        if mtmd.mtmd_decode_use_mrope(ctx):
            self.close()
            raise ValueError(
                f"{path} needs M-RoPE positions (Qwen2-VL style), which mlxcel does not lay "
                "out yet: serve the model through MLX, or a projector with plain positions"
            )
        self.non_causal = bool(mtmd.mtmd_decode_use_non_causal(ctx, None))
        """Whether an image's tokens attend to each other both ways (Gemma 3)."""
        self.n_embd = int(llama_cpp.llama_model_n_embd(model))
        self.marker = MEDIA_MARKER
        self._lock = threading.Lock()
        self._cache = ImageRows()

    def tokenize(
        self, text: str, images: Sequence[Image], max_image_tokens: int
    ) -> tuple[list[int], tuple[MediaSpan, ...]]:
        """`text`'s tokens, each marker an image's placeholders, and the images' spans."""
        with self._lock:
            bitmaps = [self._bitmap(image) for image in images]
            chunks = mtmd.mtmd_input_chunks_init()
            try:
                return self._tokenize(text, images, bitmaps, chunks, max_image_tokens)
            finally:
                mtmd.mtmd_input_chunks_free(chunks)
                for bitmap in bitmaps:
                    mtmd.mtmd_bitmap_free(bitmap)

    def _bitmap(self, image: Image) -> Any:
        pixels = (ctypes.c_uint8 * len(image.rgb)).from_buffer_copy(image.rgb)
        return mtmd.mtmd_bitmap_init(image.width, image.height, pixels)

    def _tokenize(
        self,
        text: str,
        images: Sequence[Image],
        bitmaps: list[Any],
        chunks: Any,
        max_image_tokens: int,
    ) -> tuple[list[int], tuple[MediaSpan, ...]]:
        encoded = text.encode()
        source = mtmd.mtmd_input_text()
        source.text, source.text_len = encoded, len(encoded)
        source.add_special, source.parse_special = True, True
        array = (mtmd.mtmd_bitmap_p_ctypes * max(1, len(bitmaps)))(*bitmaps)
        status = mtmd.mtmd_tokenize(self._ctx, chunks, ctypes.byref(source), array, len(bitmaps))
        if status == 1:
            raise EngineError(
                f"the prompt has {text.count(self.marker)} image markers for {len(images)} images",
                "invalid_request",
            )
        if status != 0:
            raise EngineError(f"libmtmd could not preprocess the images (status {status})")
        tokens: list[int] = []
        spans: list[MediaSpan] = []
        for i in range(mtmd.mtmd_input_chunks_size(chunks)):
            chunk = mtmd.mtmd_input_chunks_get(chunks, i)
            if mtmd.mtmd_input_chunk_get_type(chunk) == mtmd.MTMD_INPUT_CHUNK_TYPE_TEXT:
                n = ctypes.c_size_t(0)
                ids = mtmd.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n))
                tokens.extend(ids[k] for k in range(n.value))
                continue
            if mtmd.mtmd_input_chunk_get_type(chunk) != mtmd.MTMD_INPUT_CHUNK_TYPE_IMAGE:
                raise EngineError("this model's projector takes images only", "invalid_request")
            image = images[len(spans)]
            rows = self._embed(chunk, image, max_image_tokens)
            span = MediaSpan(len(tokens), rows, image.digest)
            spans.append(span)
            tokens.extend([span.placeholder] * len(rows))
        return tokens, tuple(spans)

    def _embed(self, chunk: Any, image: Image, max_image_tokens: int) -> np.ndarray:
        """The image's embedding rows: from the cache, else from the projector."""
        n_tokens = int(mtmd.mtmd_input_chunk_get_n_tokens(chunk))
        if n_tokens > max_image_tokens:
            raise EngineError(
                f"an image takes {n_tokens} tokens, more than one batch holds ({max_image_tokens}"
                "; raise --batch-size)",
                "invalid_request",
            )
        key = f"{image.digest}:{n_tokens}"
        rows = self._cache.get(key)
        if rows is not None:
            return rows
        if mtmd.mtmd_encode_chunk(self._ctx, chunk) != 0:
            raise EngineError("the vision projector failed to embed an image")
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
