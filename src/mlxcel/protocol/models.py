"""Bodies of llama-server's router routes, POST /models/load and /models/unload."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class ModelAction(BaseModel):
    """Which model to load or unload."""

    model_config = ConfigDict(extra="forbid")

    model: str
    path: str | None = None
    """POST /models/load only: a model on disk to add under the name `model` (a GGUF file or
    model folder, or what `mlxcel list` names: ORG/NAME, ORG/NAME:FILE.gguf)."""


class ModelPull(BaseModel):
    """What `POST /models/pull` downloads: `ORG/NAME` or `ORG/NAME:FILE_OR_QUANT`."""

    model_config = ConfigDict(extra="forbid")

    model: str
