"""Bodies of llama-server's router routes, POST /models/load and /models/unload."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class ModelAction(BaseModel):
    """Which model to load or unload."""

    model_config = ConfigDict(extra="forbid")

    model: str
