"""Prometheus series of a model's replicas: each replica's load, cache and restarts, labelled
by replica, and the router's decisions."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from mlxcel.engine.replica_router import Decision


class ReplicaMetrics:
    """The replica families of one app's registry; labelled per model and replica."""

    def __init__(self, registry: CollectorRegistry) -> None:
        labels = ["model", "replica"]

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, labels, registry=registry)

        def counter(name: str, doc: str, names: list[str] = labels) -> Counter:
            return Counter(name, doc, names, registry=registry)

        self.up = gauge("mlxcel_replica_up", "1 while the replica serves, else 0")
        self.running = gauge("mlxcel_replica_requests_running", "Sequences in its batch")
        self.queued = gauge("mlxcel_replica_requests_queued", "Sequences waiting for a slot")
        self.prefixes = gauge(
            "mlxcel_replica_cached_prefixes", "Prefix blocks the router believes it holds"
        )
        self.prompt = counter("mlxcel_replica_prompt_tokens", "Prompt tokens it was sent")
        self.cached = counter("mlxcel_replica_cached_tokens", "Prompt tokens it reused from cache")
        self.restarts = counter("mlxcel_replica_restarts", "Times it was started again")
        self.routed = counter(
            "mlxcel_replica_routed", "Requests routed, by decision", ["model", "decision"]
        )

    def decided(self, model: str, decision: Decision) -> None:
        """One routing decision."""
        self.routed.labels(model, decision).inc()
