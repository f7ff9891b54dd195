"""llama-server's `llamacpp:*` series on /metrics, read from ours at each scrape.

Dashboards and alerts built for llama-server read its names; these are the same counters as
the `mlxcel_*` series, summed over the models (llama-server serves one, so its series carry no
labels). Its two throughput gauges are averages since the start here, where llama-server's
cover the time since the previous scrape: a scrape changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

PREFIX = "llamacpp:"

Totals = Mapping[str, float]

# (name without `_total`, help, value from our totals): the counters, then the gauges, as
# llama-server's server-task.cpp names and describes them.
_COUNTERS: tuple[tuple[str, str, Callable[[Totals], float]], ...] = (
    (
        "prompt_tokens",
        "Number of prompt tokens processed, excluding cached tokens",
        lambda t: t["prompt"] - t["cached"],
    ),
    (
        "prompt_tokens_cached",
        "Number of prompt tokens reused from the cache",
        lambda t: t["cached"],
    ),
    ("prompt_seconds", "Total time spent processing prompts", lambda t: t["prompt_seconds"]),
    ("tokens_predicted", "Number of generation tokens processed", lambda t: t["generated"]),
    (
        "tokens_predicted_seconds",
        "Total time spent generating tokens",
        lambda t: t["generation_seconds"],
    ),
    ("n_decode", "Total number of engine steps (batched decodes)", lambda t: t["steps"]),
    (
        "spec_decode_num_draft_tokens",
        "Speculative: Total draft tokens generated",
        lambda t: t["drafted"],
    ),
    (
        "spec_decode_num_accepted_tokens",
        "Speculative: Total draft tokens accepted by the target model",
        lambda t: t["accepted"],
    ),
    (
        "spec_decode_num_drafts",
        "Speculative: Total speculative decoding verification steps",
        lambda t: t["drafts"],
    ),
)
_GAUGES: tuple[tuple[str, str, Callable[[Totals], float]], ...] = (
    (
        "prompt_tokens_seconds",
        "Average prompt throughput in tokens/s",
        lambda t: _rate(t["prompt"] - t["cached"], t["prompt_seconds"]),
    ),
    (
        "predicted_tokens_seconds",
        "Average generation throughput in tokens/s",
        lambda t: _rate(t["generated"], t["generation_seconds"]),
    ),
    # A counter in llama-server, which Prometheus would name n_tokens_max_total: a gauge here.
    (
        "n_tokens_max",
        "Largest observed sequence length (prompt + generation)",
        lambda t: t["longest"],
    ),
    ("requests_processing", "Number of requests processing", lambda t: t["running"]),
    ("requests_deferred", "Number of requests deferred", lambda t: t["waiting"]),
    (
        "n_busy_slots_per_decode",
        "Average number of busy slots per engine step",
        lambda t: t["step_sequences"] / max(t["steps"], 1.0),
    ),
)
# Our series whose largest value across models is the server's, not their sum.
_LARGEST = frozenset({"longest"})


def _rate(tokens: float, seconds: float) -> float:
    return tokens / seconds if seconds > 0 else 0.0


def _totals(families: Mapping[str, Any]) -> dict[str, float]:
    """Each of our families' value over every model (a counter's `_total` sample)."""
    totals: dict[str, float] = {}
    for key, family in families.items():
        values = []
        for metric in family.collect():
            wanted = f"{metric.name}_total" if metric.type == "counter" else metric.name
            values += [sample.value for sample in metric.samples if sample.name == wanted]
        totals[key] = max(values, default=0.0) if key in _LARGEST else sum(values)
    return totals


class LlamaSeries:
    """A Prometheus collector: llama-server's series from `EngineMetrics.families`."""

    def __init__(self, families: Mapping[str, Any]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        """The series, valued now."""
        totals = _totals(self._families)
        for name, doc, value in _COUNTERS:
            yield CounterMetricFamily(PREFIX + name, doc, value=value(totals))
        for name, doc, value in _GAUGES:
            yield GaugeMetricFamily(PREFIX + name, doc, value=value(totals))
