"""A Hugging Face BERT folder written as a llama.cpp BERT GGUF, offline, with gguf-py.

    python bench/bert_gguf.py MODEL_DIR OUT.gguf [--f16]

The same weights serve through llama.cpp as through sentence-transformers: the embedding
models (MiniLM) with the pooling their sentence-transformers config names, and
BertForSequenceClassification rerankers with rank pooling (the pooler's dense layer and tanh
as `cls`, the classifier as `cls.output`, which is the head transformers runs). The vocabulary
is the folder's WordPiece `vocab.txt`, in the phantom-space form llama.cpp's BERT tokenizer reads.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import numpy as np
from gguf import MODEL_ARCH, GGUFWriter, LlamaFileType, PoolingType, TokenType, get_tensor_name_map
from safetensors.numpy import load_file

ARCH = "bert"
# Tensors transformers keeps that no llama.cpp BERT graph reads.
SKIPPED = ("embeddings.position_ids", "cls.predictions", "cls.seq_relationship")
SPECIAL = {"[CLS]": "cls", "[SEP]": "sep", "[UNK]": "unk", "[PAD]": "pad", "[MASK]": "mask"}


def pooling(model_dir: Path, classifier: bool) -> PoolingType:
    """Rank for a sequence classifier, else what sentence-transformers' Pooling config says."""
    if classifier:
        return PoolingType.RANK
    config = model_dir / "1_Pooling" / "config.json"
    if not config.is_file():
        return PoolingType.CLS
    modes = json.loads(config.read_text())
    if modes.get("pooling_mode_cls_token"):
        return PoolingType.CLS
    if modes.get("pooling_mode_lasttoken"):
        return PoolingType.LAST
    return PoolingType.MEAN


def phantom(token: str) -> str:
    """llama.cpp's WordPiece form: a word start carries U+2581, a continuation loses `##`."""
    if token.startswith("[") and token.endswith("]"):
        return token
    return token[2:] if token.startswith("##") else "\u2581" + token


def add_vocab(writer: GGUFWriter, model_dir: Path, type_vocab: int) -> None:
    """The WordPiece vocabulary and its special tokens."""
    words = (model_dir / "vocab.txt").read_text(encoding="utf-8").splitlines()
    writer.add_tokenizer_model("bert")
    writer.add_tokenizer_pre("default")
    writer.add_token_list([phantom(w) for w in words])
    writer.add_token_types(
        [int(TokenType.CONTROL if w in SPECIAL else TokenType.NORMAL) for w in words]
    )
    writer.add_token_type_count(type_vocab)
    ids = {SPECIAL[w]: i for i, w in enumerate(words) if w in SPECIAL}
    writer.add_bos_token_id(ids["cls"])
    writer.add_eos_token_id(ids["sep"])
    writer.add_sep_token_id(ids["sep"])
    writer.add_unk_token_id(ids["unk"])
    writer.add_pad_token_id(ids["pad"])
    writer.add_mask_token_id(ids["mask"])
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(True)


def gguf_name(name: str, layers: int) -> str | None:
    """The GGUF name of a transformers tensor, None for one the graph does not use."""
    name = name.removeprefix("bert.")
    if name.startswith(SKIPPED):
        return None
    if name.startswith("pooler.dense."):
        return "cls." + name.rsplit(".", 1)[1]
    if name.startswith("classifier."):
        return "cls.output." + name.rsplit(".", 1)[1]
    mapped = get_tensor_name_map(MODEL_ARCH.BERT, layers).get_name(
        name, try_suffixes=(".weight", ".bias")
    )
    if mapped is None:
        raise ValueError(f"no llama.cpp BERT tensor for {name}")
    return mapped


def convert(model_dir: Path, out: Path, *, f16: bool = False) -> Path:
    """Write `model_dir`'s BERT as a GGUF at `out` (renamed into place when whole)."""
    config = json.loads((model_dir / "config.json").read_text())
    classifier = any("SequenceClassification" in a for a in config.get("architectures", []))
    layers = int(config["num_hidden_layers"])
    writer = GGUFWriter(out.with_name(f"{out.name}.{os.getpid()}.tmp"), ARCH)
    writer.add_name(model_dir.name)
    writer.add_context_length(int(config["max_position_embeddings"]))
    writer.add_embedding_length(int(config["hidden_size"]))
    writer.add_feed_forward_length(int(config["intermediate_size"]))
    writer.add_block_count(layers)
    writer.add_head_count(int(config["num_attention_heads"]))
    writer.add_layer_norm_eps(float(config["layer_norm_eps"]))
    writer.add_causal_attention(False)
    writer.add_pooling_type(pooling(model_dir, classifier))
    if classifier:
        labels = config.get("id2label") or {"0": "LABEL_0"}
        writer.add_classifier_output_labels([labels[k] for k in sorted(labels, key=int)])
    writer.add_file_type(LlamaFileType.MOSTLY_F16 if f16 else LlamaFileType.ALL_F32)
    add_vocab(writer, model_dir, int(config.get("type_vocab_size", 2)))
    for name, tensor in load_file(model_dir / "model.safetensors").items():
        target = gguf_name(name, layers)
        if target is None:
            continue
        values = tensor.astype(np.float32)
        # Matrices may go F16; the token-type table, norms and biases stay F32 as llama.cpp's
        # converter keeps them.
        if f16 and values.ndim == 2 and target != "token_types.weight":
            values = values.astype(np.float16)
        writer.add_tensor(target, values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert writer.path is not None
    Path(writer.path).replace(out)
    return out


def main() -> None:
    """Convert one folder and print the GGUF's path."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--f16", action="store_true", help="matrices at F16 (default F32)")
    args = parser.parse_args()
    print(convert(args.model_dir, args.out, f16=args.f16))


if __name__ == "__main__":
    main()
