"""What kind of embedding model a folder holds, read from its JSON files alone (no weights, no
engine imported): a text encoder, an image-text model (CLIP, SigLIP), or a late-interaction
model (ColBERT: PyLate's layout or the original checkpoints'). The server lists a model's
input modalities and whether it answers with a matrix before it loads it."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

Layout = Literal["text", "image-text", "late-interaction"]

# config.json model types served as image-text models, with their text-and-image towers.
IMAGE_TEXT_TYPES = ("clip", "siglip")
# sentence-transformers' CLIP module (its folder holds a transformers CLIP folder).
ST_CLIP_MODULE = "sentence_transformers.models.CLIPModel"
# Late-interaction document-image retrievers (transformers' ColQwen2 and ColPali).
VISION_RETRIEVER_TYPES = ("colqwen2", "colpali")
# The original ColBERT checkpoints' architecture, and the file their settings are in.
STANFORD_ARCHITECTURE = "HF_ColBERT"
STANFORD_METADATA = "artifact.metadata"


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object file; empty when it is missing or is not one."""
    if not path.is_file():
        return {}
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def st_modules(folder: Path) -> list[dict[str, Any]]:
    """sentence-transformers' modules.json: the pipeline's modules in order."""
    path = folder / "modules.json"
    if not path.is_file():
        return []
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    return [m for m in value if isinstance(m, dict)] if isinstance(value, list) else []


def clip_folder(folder: Path) -> Path | None:
    """The transformers folder of an image-text model: the folder itself (CLIP or SigLIP), or
    the one sentence-transformers' CLIP module names; None for other models."""
    for module in st_modules(folder):
        if module.get("type") == ST_CLIP_MODULE:
            return folder / str(module.get("path", ""))
    if read_json(folder / "config.json").get("model_type") in IMAGE_TEXT_TYPES:
        return folder
    return None


def is_stanford_colbert(folder: Path) -> bool:
    """An original ColBERT checkpoint: a BERT whose weights hold the projection (`linear`)."""
    architectures = read_json(folder / "config.json").get("architectures") or []
    return STANFORD_ARCHITECTURE in architectures


def is_pylate(folder: Path) -> bool:
    """PyLate's layout: a sentence-transformers folder whose projection is PyLate's Dense."""
    return any(str(m.get("type", "")).startswith("pylate.") for m in st_modules(folder))


@lru_cache(maxsize=64)
def is_vision_retriever(folder: Path) -> bool:
    """A ColQwen2 or ColPali folder: pages as images, queries as text, a matrix each."""
    return read_json(folder / "config.json").get("model_type") in VISION_RETRIEVER_TYPES


def folder_layout(folder: Path) -> Layout:
    """What an embedding model folder holds (a GGUF file is a text encoder). Read once per
    folder: a model's capabilities are asked for at every request's lookup."""
    if not folder.is_dir():
        return "text"
    if clip_folder(folder) is not None:
        return "image-text"
    if is_pylate(folder) or is_stanford_colbert(folder) or is_vision_retriever(folder):
        return "late-interaction"
    return "text"


def layout_modalities(folder: Path) -> tuple[str, ...]:
    """What an embedding model's inputs may be."""
    images = folder_layout(folder) == "image-text" or is_vision_retriever(folder)
    return ("text", "image") if images else ("text",)
