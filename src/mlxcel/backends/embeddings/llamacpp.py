"""GGUF embedding and reranking models on llama.cpp, in embedding mode with the GGUF's pooling
(mean, cls, last; rank for a reranker; none for one vector per token).

llama-server answers 500 "input is too large" when an input outgrows its physical batch; here
the batch is sized to the model (its training context, or the context asked for if smaller),
so every input the model can read fits, and many inputs are packed into one decode as
separate sequences."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import llama_cpp
import numpy as np

from mlxcel.backends.embeddings.types import EncoderInfo, Pooling, longest_piece

logger = logging.getLogger(__name__)

ENGINE = "llama.cpp"
DECODE_TOKENS = 2048
_POOLING: dict[int, Pooling] = {
    llama_cpp.LLAMA_POOLING_TYPE_NONE: "none",
    llama_cpp.LLAMA_POOLING_TYPE_MEAN: "mean",
    llama_cpp.LLAMA_POOLING_TYPE_CLS: "cls",
    llama_cpp.LLAMA_POOLING_TYPE_LAST: "last",
    llama_cpp.LLAMA_POOLING_TYPE_RANK: "rank",
}


def _trained_context(path: Path) -> int:
    """The context the GGUF was trained for, from its metadata (weights not loaded)."""
    probe = llama_cpp.Llama(str(path), vocab_only=True, verbose=False)
    try:
        meta = probe.metadata
        return int(meta.get(f"{meta.get('general.architecture', '')}.context_length", 512))
    finally:
        probe.close()


class LlamaCppEncoder:
    """One GGUF in embedding mode: pooled vectors, per-token vectors, or rank scores."""

    def __init__(self, path: Path, *, threads: int, ctx_size: int, batch_tokens: int) -> None:
        trained = _trained_context(path)
        max_tokens = min(trained, ctx_size) if ctx_size > 0 else trained
        # One decode holds the longest input whole, or as many short ones as the budget fits;
        # the attention mask grows with its square, so packing stops at DECODE_TOKENS.
        self._budget = max(max_tokens, min(batch_tokens, DECODE_TOKENS))
        self._llama = llama_cpp.Llama(
            str(path),
            embedding=True,
            n_ctx=self._budget,
            n_batch=self._budget,
            n_ubatch=self._budget,
            n_threads=threads,
            n_threads_batch=threads,
            verbose=False,
        )
        self._max_seqs = int(self._llama.context_params.n_seq_max)
        pooling = _POOLING.get(int(self._llama.pooling_type()), "mean")
        model = self._llama._model
        self._width = (
            int(llama_cpp.llama_model_n_cls_out(model.model))
            if pooling == "rank"
            else int(self._llama.n_embd())
        )
        ends_with = self._llama.tokenize(b"", add_bos=True, special=True)
        self.info = EncoderInfo(
            engine=ENGINE,
            max_tokens=max_tokens,
            longest_token=longest_piece(
                self._llama.detokenize([t], special=True) for t in range(self._llama.n_vocab())
            ),
            vocab_size=int(self._llama.n_vocab()),
            dimensions=0 if pooling == "rank" else int(self._llama.n_embd()),
            pooling=pooling,
            end_token=ends_with[-1] if model.add_eos_token() and ends_with else None,
        )

    def tokenize(self, texts: list[str]) -> list[list[int]]:
        """Each text's ids with the special tokens the GGUF asks for, uncut."""
        return [self._llama.tokenize(t.encode(), add_bos=True, special=True) for t in texts]

    def tokenize_pairs(self, query: str, documents: list[str]) -> list[list[int]]:
        """query with its special tokens, then each document and its end token: BERT's
        [CLS] query [SEP] document [SEP]."""
        head = self._llama.tokenize(query.encode(), add_bos=True, special=True)
        end = [self.info.end_token] if self.info.end_token is not None else []
        return [
            head + self._llama.tokenize(d.encode(), add_bos=False, special=False) + end
            for d in documents
        ]

    def _runs(self, batch: list[list[int]]) -> Iterator[list[int]]:
        """Indices of `batch` in runs of whole sequences that fit one decode."""
        run: list[int] = []
        tokens = 0
        for i, ids in enumerate(batch):
            if run and (tokens + len(ids) > self._budget or len(run) >= self._max_seqs):
                yield run
                run, tokens = [], 0
            run.append(i)
            tokens += len(ids)
        if run:
            yield run

    def _decode(self, rows: list[list[int]]) -> list[np.ndarray]:
        llama = self._llama
        ctx = llama._ctx
        llama._batch.reset()
        for seq, ids in enumerate(rows):
            llama._batch.add_sequence(ids, seq, True)
        ctx.kv_cache_clear()
        ctx.decode(llama._batch)
        llama._batch.reset()
        out: list[np.ndarray] = []
        if self.info.pooling == "none":
            width, start = int(llama.n_embd()), 0
            for ids in rows:
                out.append(
                    np.array(
                        [
                            llama_cpp.llama_get_embeddings_ith(ctx.ctx, start + j)[:width]
                            for j in range(len(ids))
                        ],
                        dtype=np.float32,
                    )
                )
                start += len(ids)
            return out
        for seq in range(len(rows)):
            pointer = llama_cpp.llama_get_embeddings_seq(ctx.ctx, seq)
            out.append(np.array(pointer[: self._width], dtype=np.float32))
        return out

    def embed(self, batch: list[list[int]]) -> list[np.ndarray]:
        """Pooled (or per-token) vectors, unnormalized, as few decodes as fit."""
        out: list[np.ndarray] = [np.empty(0, dtype=np.float32)] * len(batch)
        for run in self._runs(batch):
            for i, vector in zip(run, self._decode([batch[i] for i in run]), strict=True):
                out[i] = vector
        return out

    def score(self, batch: list[list[int]]) -> list[float]:
        """Rank pooling's first output per pair: the relevance logit."""
        return [float(v[0]) for v in self.embed(batch)]

    def close(self) -> None:
        """Free the context and the weights."""
        self._llama.close()
