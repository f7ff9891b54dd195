"""The engine of a model with replicas, as serving sees it: each request's sequences start on
the replica its router picks (`models/replicas.py`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mlxcel.engine.handle import RequestHandle
from mlxcel.engine.slots import SlotReport
from mlxcel.engine.types import EngineError
from mlxcel.models.remote import WorkerGone
from mlxcel.models.textgen import RouteRequest, TextEngine

if TYPE_CHECKING:
    from mlxcel.models.replicas import ReplicaSet


class ReplicaEngine(TextEngine):
    """The replicated model's engine: each request's sequences start on the replica the
    router picks."""

    def __init__(self, replicas: ReplicaSet) -> None:
        self._replicas = replicas

    def start(
        self,
        request_id: str,
        method: str,
        args: tuple[object, ...],
        count: int,
        route: RouteRequest,
    ) -> list[RequestHandle]:
        """Start the sequences on one replica, all or none."""
        return self._replicas.route(request_id, route, count, method, args)

    def slots(self) -> list[SlotReport]:
        """Every serving replica's slots, replica by replica."""
        reports: list[SlotReport] = []
        for replica in self._replicas.replicas:
            engine = replica.engine
            if engine is not None:
                try:
                    reports.extend(engine.slots())
                except WorkerGone:
                    continue
        return reports

    def stop(self) -> None:
        """End every generation on every replica (at shutdown, once the drain gave up)."""
        for replica in self._replicas.replicas:
            if replica.engine is not None:
                replica.engine.stop()

    def slot_file(self, action: str, slot: int, filename: str) -> dict[str, Any]:
        """Refused: a slot id names no one slot of a replicated model (each replica has its
        own), and the next request may go to any replica."""
        raise EngineError(
            "slot files are not served for a model with replicas: each replica has slots of "
            "its own; use --cache-disk, which every replica reads",
            "not_supported",
        )

    def prompt_cache(self) -> dict[str, Any]:
        """The first serving replica's prompt cache tiers (each replica has its own)."""
        for replica in self._replicas.replicas:
            if replica.engine is not None:
                try:
                    return replica.engine.prompt_cache()
                except WorkerGone:
                    continue
        return {}
