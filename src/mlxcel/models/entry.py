"""One configured model as the registry tracks it (state, leases, size, restarts), and the
errors the registry's lookups and lifecycle raise."""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Literal

from mlxcel.config.settings import ModelConfig
from mlxcel.memory import weights_bytes
from mlxcel.models.adapters import AdapterTable
from mlxcel.models.loaded import CAPABILITIES, Capability, Loaded, LoadedModel
from mlxcel.models.ray_cluster import on_ray

# A model that failed may be loaded again this many times per window before its requests are
# answered with the failure until the window passes.
RESTARTS_PER_WINDOW = 3
RESTART_WINDOW_S = 60.0
State = Literal["unloaded", "loading", "loaded", "unloading", "failed"]


class ModelNotFound(LookupError):
    """No configured model answers to the requested name (404)."""


class MissingCapability(LookupError):
    """The named model cannot do what the route does (400)."""


class ModelUnavailable(Exception):
    """The model cannot serve right now: it failed, or its load took too long (503);
    `retry_after`: the seconds until it may, where that is known."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class NoRoom(Exception):
    """Loading a model would go past --max-memory and nothing idle can be unloaded."""


class ModelBusy(Exception):
    """The model has requests running, so it cannot be unloaded now (409)."""


@dataclass
class ModelEntry:
    """One configured model: its config, its state, and the loaded model when there is one."""

    config: ModelConfig
    state: State = "unloaded"
    reason: str | None = None
    """Why the last load failed, when `state` is `failed`."""
    model: Loaded | None = None
    leases: int = 0
    """Requests holding the model: running, queued, or waiting for it to load."""
    last_used: float = field(default_factory=time.monotonic)
    task: asyncio.Future[str | None] | None = None
    """The load or unload in progress; it ends with why a load failed, or None."""
    failures: deque[float] = field(default_factory=deque)
    size: int | None = None
    """What the model took when it last loaded, measured: its worker's resident memory."""
    keep_alive: float | None = None
    """Seconds it stays loaded once idle, as the last request's keep_alive set it (Ollama's
    API; math.inf: forever); None: its configured idle timeout."""

    @property
    def idle_timeout(self) -> float:
        """Seconds idle before it is unloaded; 0: never."""
        if self.keep_alive is None:
            return self.config.idle_timeout
        return 0.0 if math.isinf(self.keep_alive) else max(self.keep_alive, 1e-9)

    adapters: AdapterTable = field(init=False)
    """Its LoRA adapters, those configured and those loaded at run time."""

    def __post_init__(self) -> None:
        self.adapters = AdapterTable(self.config)

    @property
    def name(self) -> str:
        """The served name."""
        return self.config.served_name

    @property
    def pid(self) -> int | None:
        """The process id of the model's worker, while one serves it."""
        model = self.model
        return None if model is None else model.worker.pid

    def replicas(self) -> tuple[int, list[dict[str, Any]]] | None:
        """A replicated model's threads per replica and each replica's state, while loaded."""
        model = self.model
        listing = getattr(model.worker, "listing", None) if model is not None else None
        if not isinstance(model, LoadedModel) or listing is None:
            return None
        # Local replicas (models/replicas.py), or a model's replicas on Ray (ray_worker.py).
        return model.config.threads, listing()

    @property
    def capabilities(self) -> tuple[Capability, ...]:
        """What the model can do."""
        # A text model given a vision projector is a vision model.
        kind = "vision" if self.config.mmproj is not None else self.config.kind
        if self.config.multi_vector:
            # A late-interaction model reranks by MaxSim too.
            return (*CAPABILITIES[kind], "rerank")
        return CAPABILITIES[kind]

    def answers_to(self, name: str) -> bool:
        """Whether a request's `model` field means this model."""
        names = (*self.config.names, str(self.config.model), self.config.model.name)
        return name in names or self.adapters.named_in(name, self.config.names) is not None

    @property
    def expected_size(self) -> int:
        """What loading the model will take: its measured size, else its weights on disk
        (once per replica); nothing for replicas placed on a Ray cluster, whose memory is on
        its nodes, outside this host's --max-memory."""
        if self.on_ray:
            return 0
        if self.size is not None:
            return self.size
        copies = self.config.replicas if self.capabilities[0] == "text" else 1
        return weights_bytes(self.config.model) * copies

    @property
    def on_ray(self) -> bool:
        """Whether the model's replicas are placed on the Ray cluster (`--ray`)."""
        return on_ray(self.config, self.capabilities[0])

    @property
    def evictable(self) -> bool:
        """Loaded, idle and unpinned: it may be unloaded to make room."""
        return (
            self.state == "loaded"
            and self.task is None
            and self.leases == 0
            and not self.config.pinned
        )

    def may_restart(self, now: float) -> bool:
        """Whether a failed model may try loading again (a bounded rate of restarts)."""
        while self.failures and now - self.failures[0] > RESTART_WINDOW_S:
            self.failures.popleft()
        return len(self.failures) < RESTARTS_PER_WINDOW

    def restart_in(self, now: float) -> float:
        """Seconds until a model that may not restart now may (its oldest failure in the
        window leaves it)."""
        return max(0.0, self.failures[0] + RESTART_WINDOW_S - now) if self.failures else 0.0
