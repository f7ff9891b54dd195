"""Prometheus metrics for the engine, per model, in a registry the app owns."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class EngineMetrics:
    """Counters and histograms every model's scheduler updates from its engine thread."""

    def __init__(self, registry: CollectorRegistry) -> None:
        label = ["model"]
        self.running = Gauge(
            "mlxcel_requests_running", "Sequences in the batch", label, registry=registry
        )
        self.waiting = Gauge(
            "mlxcel_requests_waiting", "Requests queued for a slot", label, registry=registry
        )
        self.rejected = Counter(
            "mlxcel_requests_rejected",
            "Requests refused with 503 (queue full or queue timeout)",
            [*label, "reason"],
            registry=registry,
        )
        self.finished = Counter(
            "mlxcel_requests_finished", "Requests finished", [*label, "reason"], registry=registry
        )
        self.prompt_tokens = Counter(
            "mlxcel_prompt_tokens", "Prompt tokens received", label, registry=registry
        )
        self.generated_tokens = Counter(
            "mlxcel_generation_tokens", "Tokens generated", label, registry=registry
        )
        self.cached_tokens = Counter(
            "mlxcel_prefix_cache_tokens",
            "Prompt tokens reused from the prefix cache",
            label,
            registry=registry,
        )
        self.cache_hits = Counter(
            "mlxcel_prefix_cache_hits",
            "Requests that reused a cached prefix",
            label,
            registry=registry,
        )
        self.cache_queries = Counter(
            "mlxcel_prefix_cache_queries",
            "Requests that looked up the prefix cache",
            label,
            registry=registry,
        )
        self.cache_hit_ratio = Gauge(
            "mlxcel_prefix_cache_hit_ratio",
            "Prefix cache hits per lookup",
            label,
            registry=registry,
        )
        self.ttft = Histogram(
            "mlxcel_time_to_first_token_seconds",
            "Time from arrival to the first token",
            label,
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.itl = Histogram(
            "mlxcel_inter_token_latency_seconds",
            "Time between a sequence's tokens",
            label,
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
