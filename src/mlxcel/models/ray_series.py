"""The Prometheus series of a model's replicas on Ray, in the HTTP process's registry.

The model's own series come from its replicas' workers: each replica holds its worker's
metric calls and sends them along its streams (`models/ray_replica.py`), and they are applied
here as a local worker's are. Each replica's series (`mlxcel_replica_*`, labelled by its Ray
replica id) come from what the HTTP process sees of it: which replicas answered, the
sequences it streams, the prompt tokens of those that ended and how many came from cache.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

from mlxcel.engine.metrics import RECORDED, EngineMetrics, MetricsPart
from mlxcel.engine.replica_router import Decision
from mlxcel.engine.types import TokenEvent

Record = tuple[str, tuple[Any, ...]]
"""A metric call of a worker: the method of `RecordsMetrics` and its arguments."""


class RaySeries:
    """One model's series, fed from its replicas' streams."""

    def __init__(self, metrics: EngineMetrics, model: str) -> None:
        self._name = model
        self._model = metrics.bind(model)
        self._replicas = metrics.replicas
        self._parts: dict[str, MetricsPart] = {}
        self._lock = threading.Lock()
        self.slots = 1
        """Each replica's slots (set once the model's facts are known)."""

    def record(self, replica: str, records: list[Record]) -> None:
        """A replica's metric calls, applied to the model's series as a local replica's (its
        gauges as its share of the model's)."""
        with self._lock:  # each request's stream has a thread of its own
            part = self._parts.get(replica)
            if part is None:
                part = self._parts[replica] = self._model.part()
        for method, args in records:
            if method in RECORDED:
                getattr(part, method)(*args)

    def decided(self, decision: Decision) -> None:
        """The router's decision for one request."""
        self._replicas.decided(self._name, decision)

    def ended(self, replica: str, event: TokenEvent) -> None:
        """A sequence ended on `replica`: its prompt tokens, and those from cache, counted."""
        if event.error is None:
            label = (self._name, replica)
            self._replicas.prompt.labels(*label).inc(event.prompt_tokens)
            self._replicas.cached.labels(*label).inc(event.cached_tokens)

    def show(self, replica: str, serving: bool, running: int) -> None:
        """Whether the replica serves, and the sequences it runs and queues; one that does not
        serve (failed, or its cluster lost) has no share of the model's gauges any more."""
        if not serving:
            with self._lock:
                part = self._parts.get(replica)
            if part is not None:
                part.engine_gone()
        label = (self._name, replica)
        self._replicas.up.labels(*label).set(1 if serving else 0)
        self._replicas.running.labels(*label).set(min(running, self.slots))
        self._replicas.queued.labels(*label).set(max(0, running - self.slots))

    def forget(self, replica: str) -> None:
        """A replica Ray replaced, or one of a lost cluster: its series go, and its share of
        the model's gauges."""
        with self._lock:
            part = self._parts.pop(replica, None)
        if part is not None:
            part.engine_gone()
        r = self._replicas
        for family in (r.up, r.running, r.queued, r.prompt, r.cached):
            with contextlib.suppress(KeyError):
                family.remove(self._name, replica)
