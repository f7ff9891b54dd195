"""Random image-text models for the embedding tests and bench/embeddings.py --images, built
offline: CLIP and SigLIP folders in Hugging Face's layout (config, weights, processor and
tokenizer files), tiny or at ViT-B/32's shape, and CLIP in sentence-transformers' layout (a
0_CLIPModel module folder)."""

from __future__ import annotations

import io
import json
from pathlib import Path

# Letters and the tests' words: what the tokenizers are made of.
LETTERS = [chr(c) for c in range(ord("a"), ord("z") + 1)] + list("0123456789.,!?'-")
SENTENCE_WORDS = (
    "the a an of to in is are was and or for on with what which who how where when why "
    "capital city france paris cat cats dog dogs sat mat eat food bread python code river"
)

TOWER = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
}
VISION = {**TOWER, "image_size": 32, "patch_size": 8}
# CLIP ViT-B/32's shape (openai/clip-vit-base-patch32): what a real image model costs.
BASE_TEXT = {
    "hidden_size": 512,
    "intermediate_size": 2048,
    "num_hidden_layers": 12,
    "num_attention_heads": 8,
}
BASE_VISION = {
    "hidden_size": 768,
    "intermediate_size": 3072,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "image_size": 224,
    "patch_size": 32,
}


def _clip_tokenizer(out_dir: Path) -> object:
    """A byte-pair vocabulary of letters (and letters ending a word), no merges: every word
    reads letter by letter, as CLIP's tokenizer reads it."""
    from transformers import CLIPTokenizer

    vocab: dict[str, int] = {}
    for token in ["<|startoftext|>", "<|endoftext|>", *LETTERS, *(f"{c}</w>" for c in LETTERS)]:
        vocab.setdefault(token, len(vocab))
    (out_dir / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    (out_dir / "merges.txt").write_text("#version: 0.2\n", encoding="utf-8")
    return CLIPTokenizer(str(out_dir / "vocab.json"), str(out_dir / "merges.txt"))


def build_clip(out_dir: Path, seed: int = 0, *, base: bool = False) -> Path:
    """A CLIPModel of two small layers a tower, its processor (32-pixel crops) and tokenizer;
    with `base`, at ViT-B/32's shape (224-pixel crops)."""
    import torch
    from transformers import CLIPConfig, CLIPImageProcessorPil, CLIPModel, CLIPProcessor

    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = _clip_tokenizer(out_dir)
    shape = (
        {**BASE_VISION, "intermediate_size": 3072, "num_attention_heads": 12} if base else VISION
    )
    side = shape["image_size"]
    text_shape = {**BASE_TEXT, "num_attention_heads": 8} if base else TOWER
    config = CLIPConfig(
        text_config={
            **text_shape,
            "vocab_size": len(tokenizer),  # type: ignore[arg-type]
            "max_position_embeddings": 40,
            "bos_token_id": 0,
            "eos_token_id": 1,
            "pad_token_id": 1,
        },
        vision_config=shape,
        projection_dim=512 if base else 24,
    )
    torch.manual_seed(seed)
    CLIPModel(config).eval().save_pretrained(out_dir)
    crop = {"height": side, "width": side}
    images = CLIPImageProcessorPil(size={"shortest_edge": side}, crop_size=crop)
    CLIPProcessor(image_processor=images, tokenizer=tokenizer).save_pretrained(out_dir)
    return out_dir


def build_siglip(out_dir: Path, seed: int = 0) -> Path:
    """A SiglipModel of two small layers a tower, with a SentencePiece tokenizer trained here
    on the tests' words and its processor (texts padded to 16 tokens, as SigLIP pads)."""
    import sentencepiece as spm
    import torch
    from transformers import (
        SiglipConfig,
        SiglipImageProcessorPil,
        SiglipModel,
        SiglipProcessor,
        SiglipTokenizer,
    )

    out_dir.mkdir(parents=True, exist_ok=True)
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter([SENTENCE_WORDS] * 20),
        model_writer=model,
        vocab_size=60,
        model_type="unigram",
        pad_id=1,
        eos_id=2,
        unk_id=3,
        bos_id=-1,
        hard_vocab_limit=False,
        minloglevel=2,
    )
    (out_dir / "spiece.model").write_bytes(model.getvalue())
    tokenizer = SiglipTokenizer(str(out_dir / "spiece.model"), model_max_length=16)
    text = {
        **TOWER,
        "vocab_size": len(tokenizer),
        "max_position_embeddings": 16,
        "pad_token_id": 1,
        "eos_token_id": 2,
        "bos_token_id": None,
    }
    config = SiglipConfig(text_config=text, vision_config=VISION)
    torch.manual_seed(seed)
    SiglipModel(config).eval().save_pretrained(out_dir)
    images = SiglipImageProcessorPil(size={"height": 32, "width": 32})
    SiglipProcessor(image_processor=images, tokenizer=tokenizer).save_pretrained(out_dir)
    return out_dir


def build_st_clip(out_dir: Path, seed: int = 0) -> Path:
    """The tiny CLIP as sentence-transformers lays out its CLIP models: modules.json naming a
    CLIPModel module whose folder is the transformers folder."""
    out_dir.mkdir(parents=True, exist_ok=True)
    build_clip(out_dir / "0_CLIPModel", seed)
    module = {"idx": 0, "name": "0", "path": "0_CLIPModel"}
    module["type"] = "sentence_transformers.models.CLIPModel"
    (out_dir / "modules.json").write_text(json.dumps([module]), encoding="utf-8")
    return out_dir


def png(seed: int, size: tuple[int, int] = (48, 40)) -> bytes:
    """A PNG of random pixels."""
    import numpy as np
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()
