"""Embedding and reranking models on torch (CPU): sentence-transformers folders and plain
Hugging Face BERT-family folders for embeddings, sequence-classification folders (CrossEncoder)
for reranking.

Inputs come as token ids and run sorted by length, in chunks whose padded size stays within a
token budget, so a batch of mixed lengths pads little."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from mlxcel.backends.embeddings.types import EncoderInfo, Pooling, longest_piece

logger = logging.getLogger(__name__)

ENGINE = "sentence-transformers"
# The model's own tokenizer says "no limit" with a huge number; position embeddings bound it.
_UNBOUNDED = 1_000_000


def chunks(batch: list[list[int]], budget: int) -> Iterator[list[int]]:
    """Indices of `batch`, longest first, in runs whose padded size fits `budget` tokens."""
    order = sorted(range(len(batch)), key=lambda i: -len(batch[i]))
    run: list[int] = []
    for i in order:
        # The first of a run is its longest: the run pads to it.
        if run and (len(run) + 1) * len(batch[run[0]]) > budget:
            yield run
            run = []
        run.append(i)
    if run:
        yield run


def _padded(rows: list[list[int]], pad: int, end: int | None, types: bool) -> dict[str, Any]:
    """input_ids, attention_mask (and token_type_ids: 1 after the first `end` token, as BERT
    marks a pair's second text) as torch tensors."""
    import torch

    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    segments = torch.zeros((len(rows), width), dtype=torch.long)
    for n, row in enumerate(rows):
        ids[n, : len(row)] = torch.tensor(row, dtype=torch.long)
        mask[n, : len(row)] = 1
        if types and end is not None and end in row:
            segments[n, row.index(end) + 1 : len(row)] = 1
    features = {"input_ids": ids, "attention_mask": mask}
    if types:
        features["token_type_ids"] = segments
    return features


def token_ids(tokenizer: Any, texts: list[str]) -> list[list[int]]:
    """Each text's ids with the tokenizer's special tokens, uncut."""
    encoded = tokenizer(texts, add_special_tokens=True, verbose=False)
    return [list(map(int, ids)) for ids in encoded["input_ids"]]


def end_token(tokenizer: Any) -> int | None:
    """The special token the tokenizer ends every input with, if any."""
    ids = tokenizer("", add_special_tokens=True)["input_ids"]
    return int(ids[-1]) if ids and ids[-1] in tokenizer.all_special_ids else None


def max_tokens(tokenizer: Any, config: Any, declared: int | None) -> int:
    limits = [n for n in (declared, tokenizer.model_max_length) if n and n < _UNBOUNDED]
    positions = getattr(config, "max_position_embeddings", None)
    if positions:
        limits.append(int(positions))
    return min(limits) if limits else 512


class TorchEmbedder:
    """A sentence-transformers model (or a plain BERT folder, mean-pooled) on torch."""

    def __init__(self, path: Path, *, threads: int, batch_tokens: int) -> None:
        import torch
        from sentence_transformers import SentenceTransformer
        from sentence_transformers.models import Normalize

        torch.set_num_threads(threads)
        model = SentenceTransformer(str(path), device="cpu", local_files_only=True).eval()
        # Serving normalizes per request (embd_normalize), so the model's own step is skipped.
        self._modules: list[Callable[[dict[str, Any]], dict[str, Any]]] = [
            m for m in model if not isinstance(m, Normalize)
        ]
        self._budget = batch_tokens
        tokenizer = model.tokenizer
        self._tokenizer = tokenizer
        self._pad = int(tokenizer.pad_token_id or 0)
        transformer = model[0]
        config = getattr(getattr(transformer, "auto_model", None), "config", None)
        self._types = "token_type_ids" in tokenizer.model_input_names
        # sentence-transformers lists query and document prompts even when they are empty.
        prompts = {name: text for name, text in model.prompts.items() if text}
        self.info = EncoderInfo(
            engine=ENGINE,
            max_tokens=max_tokens(tokenizer, config, model.max_seq_length),
            longest_token=longest_piece(tokenizer.get_vocab()),
            vocab_size=len(tokenizer),
            dimensions=int(model.get_embedding_dimension() or 0),
            pooling=_pooling(model),
            end_token=end_token(tokenizer),
            prompts=prompts,
            query_prompt="query" if "query" in prompts else None,
        )

    def tokenize(self, texts: list[str]) -> list[list[int]]:
        """Each text's ids with [CLS] and [SEP] (or the model's own), uncut."""
        return token_ids(self._tokenizer, texts)

    def features(self, rows: list[list[int]]) -> dict[str, Any]:
        """The model's inputs for `rows`, padded into one batch."""
        return _padded(rows, self._pad, None, self._types)

    def embed(self, batch: list[list[int]]) -> list[np.ndarray]:
        """Pooled vectors (or per-token ones), unnormalized."""
        import torch

        out: list[np.ndarray] = [np.empty(0, dtype=np.float32)] * len(batch)
        key = "token_embeddings" if self.info.pooling == "none" else "sentence_embedding"
        with torch.inference_mode():
            for run in chunks(batch, self._budget):
                features = self.features([batch[i] for i in run])
                for module in self._modules:
                    features = module(features)
                values = features[key].float().numpy()
                for row, i in enumerate(run):
                    vector = values[row]
                    out[i] = vector[: len(batch[i])] if key == "token_embeddings" else vector
        return out

    def close(self) -> None:
        """Drop the model (torch frees it with the last reference)."""
        self._modules.clear()


def _pooling(model: Any) -> Pooling:
    from sentence_transformers.models import Pooling as PoolingModule

    pooling = next((m for m in model if isinstance(m, PoolingModule)), None)
    if pooling is None:
        return "none"
    mode = pooling.pooling_mode
    first = str(mode if isinstance(mode, str) else mode[0])
    return {"cls": "cls", "lasttoken": "last"}.get(first, "mean")  # type: ignore[return-value]


class TorchReranker:
    """A Hugging Face sequence-classification folder (a CrossEncoder) on torch."""

    def __init__(self, path: Path, *, threads: int, batch_tokens: int) -> None:
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        torch.set_num_threads(threads)
        self._tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        self._model = AutoModelForSequenceClassification.from_pretrained(
            str(path), local_files_only=True
        ).eval()
        self._budget = batch_tokens
        self._pad = int(self._tokenizer.pad_token_id or 0)
        config = self._model.config
        self._types = (
            "token_type_ids" in self._tokenizer.model_input_names
            and getattr(config, "type_vocab_size", 1) > 1
        )
        self._end = end_token(self._tokenizer)
        self._labels = int(config.num_labels)
        self.info = EncoderInfo(
            engine=ENGINE,
            max_tokens=max_tokens(self._tokenizer, config, None),
            longest_token=longest_piece(self._tokenizer.get_vocab()),
            vocab_size=len(self._tokenizer),
            dimensions=0,
            pooling="rank",
            end_token=self._end,
        )

    def tokenize_pairs(self, query: str, documents: list[str]) -> list[list[int]]:
        """[CLS] query [SEP] document [SEP], or the model's own pair form."""
        encoded = self._tokenizer(
            [query] * len(documents), documents, add_special_tokens=True, verbose=False
        )
        return [list(map(int, ids)) for ids in encoded["input_ids"]]

    def features(self, rows: list[list[int]]) -> dict[str, Any]:
        """The model's inputs for `rows` (tokenized pairs), padded into one batch."""
        return _padded(rows, self._pad, self._end, self._types)

    def logits(self, features: dict[str, Any]) -> Any:
        """The classifier's logits, one row per pair, as a torch tensor."""
        return self._model(**features).logits

    def score(self, batch: list[list[int]]) -> list[float]:
        """The relevance logit; for a two-label head, the log-odds of label 1."""
        import torch

        scores = [0.0] * len(batch)
        with torch.inference_mode():
            for run in chunks(batch, self._budget):
                logits = self.logits(self.features([batch[i] for i in run])).float()
                one = self._labels == 1
                values = logits[:, 0] if one else logits[:, 1] - logits[:, 0]
                for row, i in enumerate(run):
                    scores[i] = float(values[row])
        return scores

    def close(self) -> None:
        """Drop the model."""
        del self._model
