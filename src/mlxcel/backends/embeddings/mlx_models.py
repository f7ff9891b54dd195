"""Embedding model folders on MLX through mlx-embeddings: Apple Silicon's engine, and the one
that reads an MLX-quantized folder; it runs on a Linux CPU too (mlx[cpu]).

mlx-embeddings gives the transformer's last hidden state; the pooling, the prompts and the
length come from the folder's sentence-transformers config as sentence-transformers reads them
(a plain folder gets mean pooling, as there). A pipeline with more than a transformer, a
pooling and a normalize step (dense layers...) is refused: it runs on the other engines."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from mlxcel.backends.embeddings.torch_models import chunks, end_token, max_tokens, token_ids
from mlxcel.backends.embeddings.types import EncoderInfo, Pooling, longest_piece

ENGINE = "mlx-embeddings"
_POOLING_MODES: dict[str, Pooling] = {
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_cls_token": "cls",
    "pooling_mode_lasttoken": "last",
}


def _json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    value = json.loads(path.read_text(encoding="utf-8"))
    return value if isinstance(value, dict) else {}


def _pooling(folder: Path) -> Pooling:
    """The pooling the folder's modules.json gives (mean without one, as sentence-transformers)."""
    modules_file = folder / "modules.json"
    if not modules_file.is_file():
        return "mean"
    modules = json.loads(modules_file.read_text(encoding="utf-8"))
    kinds = {str(m["type"]).rsplit(".", 1)[-1]: m for m in modules}
    others = set(kinds) - {"Transformer", "Pooling", "Normalize"}
    if others:
        raise ValueError(
            f"{folder.name}: mlx-embeddings cannot run its {', '.join(sorted(others))} module; "
            "serve it with --embedding-engine onnxruntime or torch"
        )
    if "Pooling" not in kinds:
        return "none"
    config = _json(folder / kinds["Pooling"]["path"] / "config.json")
    modes = [name for name, on in config.items() if name.startswith("pooling_mode_") and on]
    if len(modes) != 1 or modes[0] not in _POOLING_MODES:
        raise ValueError(
            f"{folder.name}: mlx-embeddings here pools by mean, cls or last token, not "
            f"{'+'.join(modes) or 'none'}; serve it with --embedding-engine onnxruntime or torch"
        )
    return _POOLING_MODES[modes[0]]


def _pool(hidden: np.ndarray, length: int, pooling: Pooling) -> np.ndarray:
    """One input's vector from its rows (padding cut off), or the rows themselves."""
    rows = hidden[:length]
    if pooling == "cls":
        return rows[0]
    if pooling == "last":
        return rows[-1]
    if pooling == "none":
        return rows
    return rows.mean(axis=0)


class MlxEmbedder:
    """A BERT-family (or other mlx-embeddings) folder on MLX."""

    def __init__(self, path: Path, *, batch_tokens: int) -> None:
        from mlx_embeddings.utils import load_model
        from transformers import AutoTokenizer

        pooling = _pooling(path)
        self._model = load_model(path)
        self._tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        self._budget = batch_tokens
        self._pad = int(self._tokenizer.pad_token_id or 0)
        config = _json(path / "config.json")
        declared = _json(path / "sentence_bert_config.json").get("max_seq_length")
        prompts = {
            name: text
            for name, text in _json(path / "config_sentence_transformers.json")
            .get("prompts", {})
            .items()
            if text
        }
        self.info = EncoderInfo(
            engine=ENGINE,
            max_tokens=max_tokens(self._tokenizer, SimpleNamespace(**config), declared),
            longest_token=longest_piece(self._tokenizer.get_vocab()),
            vocab_size=len(self._tokenizer),
            dimensions=int(config["hidden_size"]),
            pooling=pooling,
            end_token=end_token(self._tokenizer),
            prompts=prompts,
            query_prompt="query" if "query" in prompts else None,
        )

    def tokenize(self, texts: list[str]) -> list[list[int]]:
        """Each text's ids with the model's special tokens, uncut."""
        return token_ids(self._tokenizer, texts)

    def embed(self, batch: list[list[int]]) -> list[np.ndarray]:
        """Pooled vectors (or per-token ones), unnormalized."""
        import mlx.core as mx

        out: list[np.ndarray] = [np.empty(0, dtype=np.float32)] * len(batch)
        for run in chunks(batch, self._budget):
            width = len(batch[run[0]])
            ids = np.full((len(run), width), self._pad, dtype=np.int32)
            mask = np.zeros((len(run), width), dtype=np.int32)
            for row, i in enumerate(run):
                ids[row, : len(batch[i])] = batch[i]
                mask[row, : len(batch[i])] = 1
            hidden = self._model(mx.array(ids), attention_mask=mx.array(mask)).last_hidden_state
            values = np.array(hidden.astype(mx.float32))
            for row, i in enumerate(run):
                out[i] = _pool(values[row], len(batch[i]), self.info.pooling)
        return out

    def close(self) -> None:
        """Drop the model."""
        del self._model
