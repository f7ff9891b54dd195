"""Late-interaction text models (ColBERT) on torch: a BERT-family encoder and its linear
projection, one vector per token, in PyLate's layout (a sentence-transformers folder whose
Dense modules are PyLate's, its settings in config_sentence_transformers.json) or the original
ColBERT checkpoints' (`HF_ColBERT`, the projection in the weights as `linear`, the settings in
artifact.metadata).

Read as PyLate reads both: a marker token after [CLS] ([Q] for queries, [D] for documents); a
query padded with [MASK] to its fixed length, every row kept (the expansion attended to only
where the model says); a document's rows without its punctuation (the skiplist)."""

from __future__ import annotations

import string
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mlxcel.backends.embeddings.layout import (
    STANFORD_METADATA,
    is_pylate,
    read_json,
    st_modules,
)
from mlxcel.backends.embeddings.torch_models import chunks, end_token, token_ids
from mlxcel.backends.embeddings.types import EncoderInfo, longest_piece

ENGINE = "transformers"
_IDENTITY = "torch.nn.modules.linear.Identity"


@dataclass(frozen=True)
class ColbertSettings:
    """How a ColBERT model reads queries and documents (PyLate's names and defaults)."""

    query_prefix: str = "[Q] "
    document_prefix: str = "[D] "
    query_length: int = 32
    document_length: int = 180
    attend_to_expansion_tokens: bool = False
    do_query_expansion: bool = True
    skiplist_words: tuple[str, ...] = tuple(string.punctuation)


def colbert_settings(folder: Path) -> ColbertSettings:
    """The folder's settings: PyLate's config_sentence_transformers.json, or the original
    checkpoints' artifact.metadata (their markers are [unused0] and [unused1])."""
    base = ColbertSettings()
    if is_pylate(folder):
        given = read_json(folder / "config_sentence_transformers.json")
        expansion = bool(given.get("do_query_expansion", base.do_query_expansion))
        return ColbertSettings(
            query_prefix=str(given.get("query_prefix", base.query_prefix)),
            document_prefix=str(given.get("document_prefix", base.document_prefix)),
            query_length=int(given.get("query_length", base.query_length)),
            document_length=int(given.get("document_length", base.document_length)),
            attend_to_expansion_tokens=expansion
            and bool(given.get("attend_to_expansion_tokens", False)),
            do_query_expansion=expansion,
            skiplist_words=tuple(given.get("skiplist_words", base.skiplist_words)),
        )
    meta = read_json(folder / STANFORD_METADATA)
    return ColbertSettings(
        query_prefix=str(meta.get("query_token_id", "[unused0]")),
        document_prefix=str(meta.get("doc_token_id", "[unused1]")),
        query_length=int(meta.get("query_maxlen", base.query_length)),
        document_length=int(meta.get("doc_maxlen", base.document_length)),
        attend_to_expansion_tokens=bool(meta.get("attend_to_mask_tokens", False)),
    )


def _weights(folder: Path) -> dict[str, Any]:
    """A folder's weights (safetensors, else a torch pickle of tensors only)."""
    import torch

    safe = folder / "model.safetensors"
    if safe.is_file():
        from safetensors.torch import load_file

        return dict(load_file(str(safe)))
    return dict(torch.load(folder / "pytorch_model.bin", map_location="cpu", weights_only=True))


def projections(folder: Path) -> list[tuple[Any, Any]]:
    """The linear projections after the encoder, in order: (weight, bias or None)."""
    if not is_pylate(folder):
        weights = _weights(folder)
        if "linear.weight" not in weights:
            raise ValueError(f"{folder.name}: an HF_ColBERT folder has no linear.weight")
        return [(weights["linear.weight"], weights.get("linear.bias"))]
    layers = []
    for module in st_modules(folder)[1:]:
        where = folder / str(module.get("path", ""))
        config = read_json(where / "config.json")
        activation = config.get("activation_function", _IDENTITY)
        if activation != _IDENTITY or config.get("use_residual"):
            raise ValueError(
                f"{folder.name}: its {where.name} module has an activation or a residual; "
                "only linear projections are served"
            )
        weights = _weights(where)
        layers.append((weights["linear.weight"], weights.get("linear.bias")))
    if not layers:
        raise ValueError(f"{folder.name}: a PyLate folder without its Dense projection")
    return layers


class ColbertEmbedder:
    """A ColBERT folder on torch: a matrix per input, one row per token kept."""

    def __init__(self, path: Path, *, threads: int, batch_tokens: int) -> None:
        import torch
        from transformers import AutoModel, AutoTokenizer

        torch.set_num_threads(threads)
        self.settings = settings = colbert_settings(path)
        self._encoder = AutoModel.from_pretrained(str(path), local_files_only=True).eval()
        self._projections = projections(path)
        self._tokenizer = tokenizer = AutoTokenizer.from_pretrained(
            str(path), local_files_only=True
        )
        self._query_id = self._marker(settings.query_prefix)
        self._document_id = self._marker(settings.document_prefix)
        expansion = tokenizer.mask_token_id
        if expansion is None:
            expansion = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0
        self._expansion = int(expansion)
        # As PyLate converts them: a word the vocabulary lacks stands for the unknown token.
        vocab, unknown = tokenizer.get_vocab(), tokenizer.unk_token_id
        self._skiplist = {vocab.get(word, unknown) for word in settings.skiplist_words}
        self._budget = batch_tokens
        self.info = EncoderInfo(
            engine=ENGINE,
            max_tokens=settings.document_length,
            longest_token=longest_piece(tokenizer.get_vocab()),
            vocab_size=len(tokenizer),
            dimensions=int(self._projections[-1][0].shape[0]),
            pooling="none",
            end_token=end_token(tokenizer),
            query_tokens=settings.query_length,
        )

    def _marker(self, prefix: str) -> int:
        if not prefix:
            raise ValueError("a ColBERT model without query and document markers is not served")
        marker = self._tokenizer.get_vocab().get(prefix)
        if marker is None:
            raise ValueError(f"the tokenizer has no token for the marker {prefix!r}")
        return int(marker)

    def _marked(self, texts: list[str], marker: int) -> list[list[int]]:
        rows = token_ids(self._tokenizer, [text.strip() for text in texts])
        return [[*row[:1], marker, *row[1:]] for row in rows]

    def tokenize(self, texts: list[str]) -> list[list[int]]:
        """Each text as a document: [CLS] [D] its tokens [SEP], uncut."""
        return self._marked(texts, self._document_id)

    def tokenize_queries(self, texts: list[str]) -> list[list[int]]:
        """Each text as a query: [CLS] [Q] its tokens [SEP], uncut and not yet expanded."""
        return self._marked(texts, self._query_id)

    def _is_query(self, row: list[int]) -> bool:
        return len(row) > 1 and row[1] == self._query_id

    def _rows(self, row: list[int]) -> tuple[list[int], list[int], list[bool]]:
        """An input's ids, attention mask and which rows are kept: a query expanded to its
        length with every row kept, a document without its skiplist's tokens."""
        settings = self.settings
        if self._is_query(row) and settings.do_query_expansion:
            extra = max(0, settings.query_length - len(row))
            attend = 1 if settings.attend_to_expansion_tokens else 0
            ids = [*row, *([self._expansion] * extra)]
            return ids, [1] * len(row) + [attend] * extra, [True] * len(ids)
        if self._is_query(row):
            return row, [1] * len(row), [True] * len(row)
        return row, [1] * len(row), [t not in self._skiplist for t in row]

    def embed(self, batch: list[list[int]]) -> list[np.ndarray]:
        """Each input's matrix of projected token vectors, unnormalized."""
        import torch

        laid = [self._rows(row) for row in batch]
        out: list[np.ndarray] = [np.empty((0, self.info.dimensions), np.float32)] * len(batch)
        with torch.inference_mode():
            for run in chunks([ids for ids, _, _ in laid], self._budget):
                width = max(len(laid[i][0]) for i in run)
                ids = torch.full((len(run), width), self._expansion, dtype=torch.long)
                mask = torch.zeros((len(run), width), dtype=torch.long)
                for n, i in enumerate(run):
                    row, attention, _ = laid[i]
                    ids[n, : len(row)] = torch.tensor(row, dtype=torch.long)
                    mask[n, : len(row)] = torch.tensor(attention, dtype=torch.long)
                hidden = self._encoder(input_ids=ids, attention_mask=mask).last_hidden_state
                for weight, bias in self._projections:
                    hidden = torch.nn.functional.linear(hidden, weight, bias)
                values = hidden.float().numpy()
                for n, i in enumerate(run):
                    row, _, keep = laid[i]
                    out[i] = values[n, : len(row)][np.array(keep, dtype=bool)]
        return out

    def close(self) -> None:
        """Drop the model."""
        del self._encoder
