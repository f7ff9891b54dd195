"""Prometheus metrics for the engine, per model, in a registry the app owns."""

from __future__ import annotations

import threading
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from mlxcel.engine.llama_series import LlamaSeries
from mlxcel.engine.replica_metrics import ReplicaMetrics

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class EngineMetrics:
    """The metric families; `bind` gives one model's children."""

    def __init__(self, registry: CollectorRegistry) -> None:
        def family(kind: type, name: str, doc: str, *extra: str) -> Any:
            return kind(name, doc, ["model", *extra], registry=registry)

        def histogram(name: str, doc: str) -> Histogram:
            return Histogram(name, doc, ["model"], buckets=_LATENCY_BUCKETS, registry=registry)

        self.families: dict[str, Any] = {
            "running": family(Gauge, "mlxcel_requests_running", "Sequences in the batch"),
            "waiting": family(Gauge, "mlxcel_requests_waiting", "Requests queued for a slot"),
            "rejected": family(
                Counter, "mlxcel_requests_rejected", "Requests refused with 503", "reason"
            ),
            "finished": family(Counter, "mlxcel_requests_finished", "Requests finished", "reason"),
            "prompt": family(Counter, "mlxcel_prompt_tokens", "Prompt tokens received"),
            "generated": family(Counter, "mlxcel_generation_tokens", "Tokens generated"),
            "cached": family(
                Counter, "mlxcel_prefix_cache_tokens", "Prompt tokens reused from the prefix cache"
            ),
            "hits": family(Counter, "mlxcel_prefix_cache_hits", "Requests that reused a prefix"),
            "queries": family(
                Counter, "mlxcel_prefix_cache_queries", "Requests that looked up the prefix cache"
            ),
            "hit_ratio": family(Gauge, "mlxcel_prefix_cache_hit_ratio", "Hits per lookup"),
            "ram_loads": family(
                Counter,
                "mlxcel_prompt_cache_ram_loads",
                "Requests whose prefix was loaded back from the host-memory prompt cache",
            ),
            "ram_bytes": family(
                Gauge, "mlxcel_prompt_cache_ram_bytes", "Bytes of KV state in the prompt cache"
            ),
            "disk_loads": family(
                Counter,
                "mlxcel_prompt_cache_disk_loads",
                "Requests whose prefix was loaded from the disk prompt cache",
            ),
            "disk_load_seconds": family(
                Counter, "mlxcel_prompt_cache_disk_load_seconds", "Time spent loading from disk"
            ),
            "disk_entries": family(
                Gauge, "mlxcel_prompt_cache_disk_entries", "States in the disk prompt cache"
            ),
            "disk_bytes": family(
                Gauge, "mlxcel_prompt_cache_disk_bytes", "Bytes of the disk prompt cache"
            ),
            "ttft": histogram(
                "mlxcel_time_to_first_token_seconds", "Time from arrival to the first token"
            ),
            "itl": histogram("mlxcel_inter_token_latency_seconds", "Time between tokens"),
            "drafted": family(
                Counter,
                "mlxcel_spec_decode_draft_tokens",
                "Speculative decoding: tokens drafted for verification",
            ),
            "accepted": family(
                Counter,
                "mlxcel_spec_decode_accepted_tokens",
                "Speculative decoding: drafted tokens the model accepted",
            ),
            "drafts": family(
                Counter, "mlxcel_spec_decode_drafts", "Speculative decoding: drafts verified"
            ),
            "acceptance": family(
                Gauge,
                "mlxcel_spec_decode_acceptance_ratio",
                "Speculative decoding: accepted per drafted token, since the start",
            ),
            "steps": family(
                Counter, "mlxcel_decode_steps", "Engine steps (one batched decode of every feed)"
            ),
            "step_sequences": family(
                Counter, "mlxcel_decode_step_sequences", "Sequences fed, summed over engine steps"
            ),
            "step_tokens": family(
                Counter, "mlxcel_decode_step_tokens", "Tokens evaluated, summed over engine steps"
            ),
            "prompt_steps": family(
                Counter, "mlxcel_prompt_steps", "Engine steps that evaluated prompt tokens"
            ),
            "busy": family(
                Gauge,
                "mlxcel_busy_slots_per_decode",
                "Sequences per engine step since the start (as n_busy_slots_per_decode)",
            ),
            "prompt_seconds": family(
                Counter,
                "mlxcel_prompt_seconds",
                "Time from a sequence's slot to its first token, summed over sequences",
            ),
            "generation_seconds": family(
                Counter,
                "mlxcel_generation_seconds",
                "Time from a sequence's first token to its last, summed over sequences",
            ),
            "longest": family(
                Gauge,
                "mlxcel_sequence_tokens_max",
                "The longest sequence so far, prompt and generated tokens",
            ),
        }
        # Dashboards built for llama-server read its names: the same series under them.
        registry.register(LlamaSeries(self.families))
        self.replicas = ReplicaMetrics(registry)

    def bind(self, model: str) -> ModelMetrics:
        """One model's metrics, labelled once so the engine's hot path does no lookups."""
        return ModelMetrics(self, model)


class RecordsMetrics(Protocol):
    """What a model's scheduler records, from its engine thread."""

    def admitted(self, prompt_tokens: int, cached_tokens: int) -> None:
        """A request got a slot, reusing `cached_tokens` of its prompt."""
        ...

    def cache_loaded(self) -> None:
        """A request's prefix came back from the host-memory prompt cache."""
        ...

    def cache_size(self, total_bytes: int) -> None:
        """What the host-memory prompt cache holds now."""
        ...

    def disk_loaded(self, seconds: float) -> None:
        """A request's prefix was loaded from the disk prompt cache in `seconds`."""
        ...

    def disk_size(self, entries: int, total_bytes: int) -> None:
        """What the disk prompt cache holds now."""
        ...

    def token(self, first: bool, seconds: float) -> None:
        """A token was generated `seconds` after arrival (first) or after the previous one."""
        ...

    def drafted(self, drafted: int, accepted: int) -> None:
        """A draft of `drafted` tokens was verified and `accepted` of them kept."""
        ...

    def stepped(self, sequences: int, tokens: int, prompt_tokens: int) -> None:
        """One engine step fed `sequences` sequences `tokens` tokens, `prompt_tokens` of them
        from prompts."""
        ...

    def measured(self, tokens: int, prompt_seconds: float, generation_seconds: float) -> None:
        """A sequence of `tokens` tokens ended: its prompt took `prompt_seconds` to its first
        token, then it generated for `generation_seconds`."""
        ...

    def load(self, running: int, waiting: int) -> None:
        """How many sequences run and how many requests wait."""
        ...

    def rejected(self, reason: str) -> None:
        """A request was refused with 503."""
        ...

    def finished(self, reason: str) -> None:
        """A request ended (stop, length, cancelled, error)."""
        ...


# The methods of RecordsMetrics: what a model's worker process may ask the HTTP process to record.
RECORDED = frozenset(
    (
        "admitted",
        "cache_loaded",
        "cache_size",
        "disk_loaded",
        "disk_size",
        "token",
        "drafted",
        "stepped",
        "measured",
        "load",
        "rejected",
        "finished",
    )
)


class ModelMetrics:
    """One model's Prometheus children: what its scheduler records (`RecordsMetrics`)."""

    def __init__(self, metrics: EngineMetrics, model: str) -> None:
        f = metrics.families
        self._model = model
        self._rejected, self._finished = f["rejected"], f["finished"]
        self._running, self._waiting = f["running"].labels(model), f["waiting"].labels(model)
        self._prompt, self._cached = f["prompt"].labels(model), f["cached"].labels(model)
        self._hits, self._queries = f["hits"].labels(model), f["queries"].labels(model)
        self._hit_ratio = f["hit_ratio"].labels(model)
        self._ram_loads, self._ram_bytes = (
            f["ram_loads"].labels(model),
            f["ram_bytes"].labels(model),
        )
        self._disk = [f[name].labels(model) for name in ("disk_loads", "disk_load_seconds")]
        self._disk_size = [f[name].labels(model) for name in ("disk_entries", "disk_bytes")]
        self._generated = f["generated"].labels(model)
        self._ttft, self._itl = f["ttft"].labels(model), f["itl"].labels(model)
        self._drafted, self._accepted = f["drafted"].labels(model), f["accepted"].labels(model)
        self._drafts, self._acceptance = f["drafts"].labels(model), f["acceptance"].labels(model)
        self._steps, self._step_sequences = (
            f["steps"].labels(model),
            f["step_sequences"].labels(model),
        )
        self._step_tokens = f["step_tokens"].labels(model)
        self._prompt_steps, self._busy = f["prompt_steps"].labels(model), f["busy"].labels(model)
        self._prompt_seconds = f["prompt_seconds"].labels(model)
        self._generation_seconds = f["generation_seconds"].labels(model)
        self._longest, self._n_longest = f["longest"].labels(model), 0
        self._n_steps = 0
        self._n_sequences = 0
        # Each part's gauges (sequences running and waiting, prompt-cache bytes), whose sums
        # the model's gauges show: the worker processes of a replicated model.
        self._parts: dict[int, tuple[int, int, int]] = {}
        self._parts_lock = threading.Lock()
        self._lookups = 0
        self._cache_hits = 0
        self._draft_tokens = 0
        self._accepted_tokens = 0

    def admitted(self, prompt_tokens: int, cached_tokens: int) -> None:
        """A request got a slot, reusing `cached_tokens` of its prompt."""
        self._lookups += 1
        self._cache_hits += cached_tokens > 0
        self._prompt.inc(prompt_tokens)
        self._queries.inc()
        self._cached.inc(cached_tokens)
        if cached_tokens:
            self._hits.inc()
        self._hit_ratio.set(self._cache_hits / self._lookups)

    def cache_loaded(self) -> None:
        """A request's prefix came back from the host-memory prompt cache."""
        self._ram_loads.inc()

    def cache_size(self, total_bytes: int) -> None:
        """What the host-memory prompt cache holds now."""
        self._ram_bytes.set(total_bytes)

    def disk_loaded(self, seconds: float) -> None:
        """A request's prefix was loaded from the disk prompt cache in `seconds`."""
        self._disk[0].inc()
        self._disk[1].inc(seconds)

    def disk_size(self, entries: int, total_bytes: int) -> None:
        """What the disk prompt cache holds now."""
        self._disk_size[0].set(entries)
        self._disk_size[1].set(total_bytes)

    def token(self, first: bool, seconds: float) -> None:
        """A token was generated `seconds` after arrival (first) or after the previous one."""
        (self._ttft if first else self._itl).observe(seconds)
        self._generated.inc()

    def drafted(self, drafted: int, accepted: int) -> None:
        """A draft of `drafted` tokens was verified and `accepted` of them kept."""
        self._draft_tokens += drafted
        self._accepted_tokens += accepted
        self._drafted.inc(drafted)
        self._accepted.inc(accepted)
        self._drafts.inc()
        self._acceptance.set(self._accepted_tokens / self._draft_tokens)

    def stepped(self, sequences: int, tokens: int, prompt_tokens: int) -> None:
        """One engine step fed `sequences` sequences `tokens` tokens, `prompt_tokens` of them
        from prompts."""
        self._n_steps += 1
        self._n_sequences += sequences
        self._steps.inc()
        self._step_sequences.inc(sequences)
        self._step_tokens.inc(tokens)
        if prompt_tokens:
            self._prompt_steps.inc()
        self._busy.set(self._n_sequences / self._n_steps)

    def measured(self, tokens: int, prompt_seconds: float, generation_seconds: float) -> None:
        """A sequence of `tokens` tokens ended: its prompt took `prompt_seconds` to its first
        token, then it generated for `generation_seconds`."""
        self._prompt_seconds.inc(prompt_seconds)
        self._generation_seconds.inc(generation_seconds)
        if tokens > self._n_longest:
            self._n_longest = tokens
            self._longest.set(tokens)

    def load(self, running: int, waiting: int) -> None:
        """How many sequences run and how many requests wait."""
        self._running.set(running)
        self._waiting.set(waiting)

    def part(self) -> MetricsPart:
        """What one of several worker processes of the model records: its counters go to the
        model's, its gauges add up with the other parts'."""
        return MetricsPart(self)

    def part_gauges(self, part: object, running: int, waiting: int, cache_bytes: int) -> None:
        """A part's gauges now; the model's show every part's sum."""
        with self._parts_lock:
            self._parts[id(part)] = (running, waiting, cache_bytes)
            sums = [sum(values) for values in zip(*self._parts.values(), strict=True)]
        self.load(sums[0], sums[1])
        self.cache_size(sums[2])

    def engine_gone(self) -> None:
        """The process that recorded the gauges ended without a last word (killed, crashed):
        nothing of it runs, waits or is cached any more, though it never said so."""
        self.load(0, 0)
        self.cache_size(0)

    def rejected(self, reason: str) -> None:
        """A request was refused with 503."""
        self._rejected.labels(self._model, reason).inc()

    def finished(self, reason: str) -> None:
        """A request ended (stop, length, cancelled, error)."""
        self._finished.labels(self._model, reason).inc()


class MetricsPart:
    """One of several worker processes of a model (a replica), recording into the model's
    series: its counters and histograms as they come, its gauges as its share of the model's
    (a replica's `load` would otherwise replace the other replicas')."""

    def __init__(self, whole: ModelMetrics) -> None:
        self._whole = whole
        self._running = self._waiting = self._cache_bytes = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._whole, name)

    def load(self, running: int, waiting: int) -> None:
        self._running, self._waiting = running, waiting
        self._whole.part_gauges(self, running, waiting, self._cache_bytes)

    def cache_size(self, total_bytes: int) -> None:
        self._cache_bytes = total_bytes
        self._whole.part_gauges(self, self._running, self._waiting, total_bytes)

    def engine_gone(self) -> None:
        """The part's process ended: nothing of it runs, waits or is cached any more."""
        self._running = self._waiting = self._cache_bytes = 0
        self._whole.part_gauges(self, 0, 0, 0)
