"""Ollama's model routes: /api/tags, /api/show and /api/ps objects, read from the models.

`details` come from the weights themselves: a GGUF's header (architecture, size label or its
tensors' parameter count, file type), a model folder's config.json and safetensors headers.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import struct
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from mlxcel.memory import weights_bytes
from mlxcel.mmproj import gguf_summary
from mlxcel.models.entry import ModelEntry
from mlxcel.models.loaded import LoadedModel
from mlxcel.protocol.errors import APIError
from mlxcel.serving.infill import fim_layout

# llama.cpp's LLAMA_FTYPE numbers, as general.file_type holds them.
_FILE_TYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
    11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S",
    17: "Q5_K_M", 18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS",
    23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M",
    30: "IQ4_XS", 31: "IQ1_M", 32: "BF16", 36: "TQ1_0", 37: "TQ2_0", 38: "MXFP4",
}  # fmt: skip
# Markup a chat template writes when its model thinks before answering.
_THINKING_MARKUP = ("<think>", "enable_thinking", "reasoning_content", "<|channel|>")
# A keep_alive of forever, as Ollama reports it in expires_at.
_FOREVER = datetime(2318, 1, 1, tzinfo=timezone.utc)


def tagged(name: str) -> str:
    """A served name as Ollama lists one: with its tag (`:latest` when it has none)."""
    return name if ":" in name.rsplit("/", 1)[-1] else f"{name}:latest"


def _size_text(count: int) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if count >= scale:
            return f"{count / scale:.1f}{unit}".replace(".0" + unit, unit)
    return str(count)


@functools.lru_cache(maxsize=32)
def _folder_facts(path: Path) -> tuple[dict[str, Any], int]:
    """A model folder's config.json and its parameter count, from the safetensors headers
    (packed quantized weights counted at their bits)."""
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        config = {}
    quantization = config.get("quantization") or {}
    per_word = 32 // int(quantization.get("bits", 32)) if quantization else 1
    count = 0
    for file in sorted(path.glob("*.safetensors")):
        try:
            with file.open("rb") as handle:
                (length,) = struct.unpack("<Q", handle.read(8))
                header = json.loads(handle.read(length))
        except (OSError, ValueError, struct.error):
            continue
        for name, tensor in header.items():
            if name == "__metadata__" or not isinstance(tensor, dict):
                continue
            packed = per_word if tensor.get("dtype") == "U32" else 1
            count += math.prod(tensor.get("shape", [])) * packed
    return config, count


def details(entry: ModelEntry) -> tuple[dict[str, Any], dict[str, Any]]:
    """Ollama's `details` and `model_info` of a model, read from its weights."""
    path = entry.config.model
    info: dict[str, Any] = {}
    if path.is_file():
        try:
            values, count = gguf_summary(path)
        except (OSError, ValueError, struct.error):
            values, count = {}, 0
        family = str(values.get("general.architecture", ""))
        size = str(values.get("general.size_label") or _size_text(count))
        file_type = values.get("general.file_type")
        level = _FILE_TYPES.get(file_type, "") if isinstance(file_type, int) else ""
        info = {k: v for k, v in values.items() if not k.startswith("tokenizer.")}
        kind = "gguf"
    else:
        config, count = _folder_facts(path)
        family = str(config.get("model_type", ""))
        size = _size_text(count) if count else ""
        quantization = config.get("quantization")
        if isinstance(quantization, dict) and "bits" in quantization:
            level = f"Q{quantization['bits']}"
        else:
            level = str(config.get("torch_dtype") or config.get("dtype") or "").upper()
            level = {"FLOAT16": "F16", "BFLOAT16": "BF16", "FLOAT32": "F32"}.get(level, level)
        info = {"general.architecture": family}
        kind = "safetensors"
    info["general.parameter_count"] = count
    shape = {
        "parent_model": "",
        "format": kind,
        "family": family,
        "families": [family] if family else None,
        "parameter_size": size,
        "quantization_level": level,
    }
    return shape, info


def digest(entry: ModelEntry) -> str:
    """A stable id for the model's weights (Ollama's is the manifest's sha256)."""
    path = entry.config.model
    try:
        stamp = f"{path.resolve()}:{path.stat().st_mtime_ns}"
    except OSError:
        stamp = str(path)
    return hashlib.sha256(stamp.encode()).hexdigest()


def _modified(entry: ModelEntry) -> str:
    try:
        stamp = entry.config.model.stat().st_mtime
    except OSError:
        stamp = time.time()
    moment = datetime.fromtimestamp(stamp, timezone.utc)
    return moment.isoformat().replace("+00:00", "Z")


def _size(entry: ModelEntry) -> int:
    try:
        return weights_bytes(entry.config.model)
    except OSError:
        return 0


def listed(entry: ModelEntry) -> dict[str, Any]:
    """One model as /api/tags lists it."""
    name = tagged(entry.name)
    return {
        "name": name,
        "model": name,
        "modified_at": _modified(entry),
        "size": _size(entry),
        "digest": digest(entry),
        "details": details(entry)[0],
    }


def capabilities(entry: ModelEntry, model: Any) -> list[str]:
    """What /api/show says the model does: completion, tools, thinking, vision, insert,
    embedding."""
    if "embedding" in entry.capabilities:
        return ["embedding"]
    if not isinstance(model, LoadedModel):
        return []
    found = ["completion"]
    template = model.chat_template.source if model.chat_template else ""
    if "tools" in template:
        found.append("tools")
    if model.reasoning_parser != "none" and any(m in template for m in _THINKING_MARKUP):
        found.append("thinking")
    if "vision" in entry.capabilities:
        found.append("vision")
    try:
        fim_layout(model, "model")
        found.append("insert")
    except APIError:
        pass
    return found


def shown(entry: ModelEntry, model: Any) -> dict[str, Any]:
    """POST /api/show: details, model_info, template, parameters and capabilities."""
    shape, info = details(entry)
    template = ""
    parameters: list[str] = []
    if isinstance(model, LoadedModel):
        template = model.chat_template.source if model.chat_template else ""
        # Where clients read the context length from: the one served, not the trained one.
        info[f"{shape['family'] or 'general'}.context_length"] = model.generator.n_ctx_seq
        defaults = model.defaults
        for name in ("temperature", "top_p", "top_k", "min_p", "repeat_penalty", "repeat_last_n"):
            parameters.append(f"{name:<15} {getattr(defaults, name)}")
        if model.chat_template and model.chat_template.eos_token:
            parameters.append(f'{"stop":<15} "{model.chat_template.eos_token}"')
    return {
        "modelfile": f"# served by mlxcel\nFROM {entry.config.model.name}\n",
        "parameters": "\n".join(parameters),
        "template": template,
        "details": shape,
        "model_info": info,
        "capabilities": capabilities(entry, model),
        "modified_at": _modified(entry),
    }


def running(entry: ModelEntry, idle_timeout: float) -> dict[str, Any]:
    """One loaded model as /api/ps lists it; `idle_timeout` 0 or inf: it stays loaded."""
    model = entry.model
    context = model.generator.n_ctx_seq if isinstance(model, LoadedModel) else 0
    if idle_timeout <= 0 or math.isinf(idle_timeout):
        expires = _FOREVER
    else:
        left = max(0.0, entry.last_used + idle_timeout - time.monotonic())
        expires = datetime.fromtimestamp(time.time() + left, timezone.utc)
    size = entry.size if entry.size is not None else _size(entry)
    item = listed(entry)
    del item["modified_at"]
    return {
        **item,
        "size": size,
        "size_vram": 0,
        "expires_at": expires.isoformat().replace("+00:00", "Z"),
        "context_length": context,
    }
