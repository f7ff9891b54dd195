"""Tiny random ColBERT models for the late-interaction tests, built offline in the two layouts
served (PyLate's, and the original ColBERT checkpoints' `HF_ColBERT`), and PyLate's encoding
written out from its source (pylate installs only with a CUDA torch here): the reference the
server's matrices are held to."""

from __future__ import annotations

import json
import string
from pathlib import Path
from typing import Any

import numpy as np

from tests.encoder_models import LETTERS, SPECIALS, WORDS

QUERY_LENGTH = 12
DOCUMENT_LENGTH = 40
DIM = 16
PUNCTUATION = list(string.punctuation)


def _bert(out_dir: Path, seed: int, extra: list[str]) -> tuple[Any, Any]:
    """A small BertModel and its WordPiece tokenizer, saved in `out_dir`."""
    import torch
    from transformers import BertConfig, BertModel, BertTokenizerFast

    out_dir.mkdir(parents=True, exist_ok=True)
    words = [w for w in WORDS if w not in LETTERS]
    vocab = [*SPECIALS, "[unused0]", "[unused1]", *LETTERS, *(f"##{c}" for c in LETTERS), *words]
    (out_dir / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    tokenizer = BertTokenizerFast(str(out_dir / "vocab.txt"), do_lower_case=True)
    if extra:
        tokenizer.add_tokens(extra)
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    torch.manual_seed(seed)
    model = BertModel(config, add_pooling_layer=False).eval()
    tokenizer.save_pretrained(out_dir)
    return model, tokenizer


def build_pylate(out_dir: Path, seed: int = 0, attend_to_expansion: bool = False) -> Path:
    """PyLate's layout: the encoder at the top, its [Q] and [D] markers added to the
    tokenizer, a 1_Dense module, and the settings in config_sentence_transformers.json."""
    import torch
    from safetensors.torch import save_file

    model, _ = _bert(out_dir, seed, ["[Q] ", "[D] "])
    model.save_pretrained(out_dir)
    dense = out_dir / "1_Dense"
    dense.mkdir()
    torch.manual_seed(seed + 1)
    save_file({"linear.weight": torch.randn(DIM, 32) * 0.2}, str(dense / "model.safetensors"))
    identity = "torch.nn.modules.linear.Identity"
    (dense / "config.json").write_text(
        json.dumps(
            {"in_features": 32, "out_features": DIM, "bias": False, "activation_function": identity}
        )
    )
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Dense", "type": "pylate.models.Dense.Dense"},
    ]
    (out_dir / "modules.json").write_text(json.dumps(modules))
    settings = {
        "query_prefix": "[Q] ",
        "document_prefix": "[D] ",
        "query_length": QUERY_LENGTH,
        "document_length": DOCUMENT_LENGTH,
        "attend_to_expansion_tokens": attend_to_expansion,
        "skiplist_words": PUNCTUATION,
        "do_query_expansion": True,
    }
    (out_dir / "config_sentence_transformers.json").write_text(json.dumps(settings))
    (out_dir / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": DOCUMENT_LENGTH - 1, "do_lower_case": False})
    )
    return out_dir


def build_stanford(out_dir: Path, seed: int = 0) -> Path:
    """The original ColBERT layout: `HF_ColBERT` weights (bert.* and linear.weight) and
    artifact.metadata with its [unused0]/[unused1] markers."""
    import torch
    from safetensors.torch import save_file

    model, _ = _bert(out_dir, seed, [])
    model.config.architectures = ["HF_ColBERT"]
    model.config.save_pretrained(out_dir)
    torch.manual_seed(seed + 1)
    weights = {f"bert.{k}": v.contiguous() for k, v in model.state_dict().items()}
    weights["linear.weight"] = torch.randn(DIM, 32) * 0.2
    save_file(weights, str(out_dir / "model.safetensors"))
    metadata = {
        "query_token_id": "[unused0]",
        "doc_token_id": "[unused1]",
        "query_maxlen": QUERY_LENGTH,
        "doc_maxlen": DOCUMENT_LENGTH,
        "dim": DIM,
        "attend_to_mask_tokens": False,
    }
    (out_dir / "artifact.metadata").write_text(json.dumps(metadata))
    return out_dir


def pylate_encode(
    folder: Path, texts: list[str], is_query: bool, prefix: str, attend_to_expansion: bool
) -> list[np.ndarray]:
    """PyLate's ColBERT.encode, written from its source: tokenized with [MASK] as padding
    (queries padded to their length less one), the marker inserted after [CLS], the encoder
    and projection, queries every row kept, documents without padding and punctuation, each
    row normalized."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoTokenizer, BertModel

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    tokenizer.pad_token = tokenizer.mask_token
    model = BertModel.from_pretrained(str(folder), add_pooling_layer=False).eval()
    stanford = (folder / "artifact.metadata").is_file()
    dense = folder if stanford else folder / "1_Dense"
    weights = load_file(str(dense / "model.safetensors"))
    length = QUERY_LENGTH if is_query else DOCUMENT_LENGTH
    features = tokenizer(
        [t.strip() for t in texts],
        padding="max_length" if is_query else True,
        truncation=True,
        max_length=length - 1,
        return_tensors="pt",
    )
    marker = tokenizer.convert_tokens_to_ids(prefix)

    def insert(values: Any, value: int) -> Any:
        column = torch.full((values.shape[0], 1), value, dtype=values.dtype)
        return torch.cat([values[:, :1], column, values[:, 1:]], dim=1)

    ids = insert(features["input_ids"], marker)
    attention = insert(features["attention_mask"], 1)
    if is_query and attend_to_expansion:
        attention.fill_(1)
    with torch.no_grad():
        hidden = model(input_ids=ids, attention_mask=attention).last_hidden_state
        projected = hidden @ weights["linear.weight"].T
    skip = torch.tensor([tokenizer.convert_tokens_to_ids(w) for w in PUNCTUATION])
    out = []
    for n in range(len(texts)):
        if is_query:
            keep = torch.ones(ids.shape[1], dtype=torch.bool)
        else:
            keep = attention[n].bool() & ~torch.isin(ids[n], skip)
        rows = torch.nn.functional.normalize(projected[n][keep], p=2, dim=1)
        out.append(rows.numpy())
    return out


def build_colqwen(out_dir: Path, seed: int = 0) -> Path:
    """A ColQwen2 (transformers' ColQwen2ForRetrieval) on the tiny random Qwen2-VL of
    tests/mlx_qwen2vl.py, with its ColQwen2Processor."""
    import shutil

    import torch
    from transformers import (
        AutoImageProcessor,
        AutoTokenizer,
        ColQwen2Config,
        ColQwen2ForRetrieval,
        ColQwen2Processor,
    )

    from tests.hf_qwen2vl import tiny_config

    base = out_dir.with_name(out_dir.name + "-base")
    vlm = tiny_config(base)
    torch.manual_seed(seed)
    ColQwen2ForRetrieval(ColQwen2Config(vlm_config=vlm, embedding_dim=DIM)).eval().save_pretrained(
        out_dir
    )
    images, tokenizer = (
        AutoImageProcessor.from_pretrained(base),
        AutoTokenizer.from_pretrained(base),
    )
    ColQwen2Processor(image_processor=images, tokenizer=tokenizer).save_pretrained(out_dir)
    shutil.rmtree(base)
    return out_dir


def colqwen_encode(folder: Path, texts: list[str], pictures: list[bytes]) -> list[np.ndarray]:
    """transformers' own ColQwen2 matrices: each text as a query, then each image, one at a
    time, the rows the attention mask keeps."""
    import io

    import torch
    from PIL import Image
    from transformers import ColQwen2ForRetrieval, ColQwen2Processor

    model = ColQwen2ForRetrieval.from_pretrained(str(folder)).eval()
    processor = ColQwen2Processor.from_pretrained(str(folder))
    batches = [processor.process_queries(text=[t]) for t in texts]
    batches += [
        processor.process_images(images=[Image.open(io.BytesIO(p)).convert("RGB")])
        for p in pictures
    ]
    out = []
    with torch.no_grad():
        for batch in batches:
            rows = model(**batch).embeddings[0]
            out.append(rows[batch["attention_mask"][0].bool()].numpy())
    return out
