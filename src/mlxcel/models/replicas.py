"""A text model served by several worker processes on this machine: its replicas, each with
its own engine, KV cache and prompt cache, and the router that sends each request to one.

`ReplicaSet` stands where one model's `Worker` stands (its pid, calls, abort, stop), so the
registry holds a replicated model as it holds any other; `ReplicaEngine` stands where the
model's `RemoteEngine` stands, so serving submits to it unchanged. A replica whose process
ends fails only its own requests (its worker's reader answers them with `WorkerGone`, a 503
`model_unavailable`); the next requests go to the others, and it is started again on a thread
of its own, at the registry's bounded rate. The model stays loaded while any replica serves.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from mlxcel.config.cores import default_threads, usable_cores
from mlxcel.config.settings import ModelConfig
from mlxcel.engine.handle import RequestHandle
from mlxcel.engine.metrics import EngineMetrics, MetricsPart, RecordsMetrics
from mlxcel.engine.replica_router import (
    NoReplica,
    Policy,
    PrefixRouter,
    RouteRequest,
    check_room,
)
from mlxcel.engine.types import EngineError, TokenEvent
from mlxcel.models.remote import Worker, WorkerGone
from mlxcel.models.replica_engine import ReplicaEngine
from mlxcel.models.textgen import RemoteEngine
from mlxcel.wire.facts import MODEL_UNAVAILABLE, TextFacts
from mlxcel.wire.messages import Setup

logger = logging.getLogger(__name__)

# A replica that failed may start again this many times per window, then waits for the window.
RESTARTS_PER_WINDOW = 3
RESTART_WINDOW_S = 60.0
ReplicaState = Literal["starting", "serving", "failed", "stopped"]
StartWorker = Callable[
    [ModelConfig, RecordsMetrics, Callable[[Worker, str], None]], tuple[Worker, TextFacts]
]


def replica_threads(config: ModelConfig) -> int:
    """Threads per replica: as set, or with `threads` left at its default, the usable cores
    divided among the replicas."""
    if config.threads != default_threads():
        return config.threads
    return max(1, usable_cores() // config.replicas)


@dataclass
class Replica:
    """One worker process of the model, as the replica set tracks it."""

    index: int
    worker: Worker | None = None
    engine: RemoteEngine | None = None
    state: ReplicaState = "starting"
    reason: str | None = None
    in_flight: int = 0
    """Sequences sent to it and not ended (on the event loop)."""
    restarts: int = 0
    failures: deque[float] = field(default_factory=deque)
    metrics: MetricsPart | None = None
    """Its share of the model's series (its worker's metric calls)."""

    def restart_wait(self, now: float) -> float:
        """Seconds until it may start again (0: now), at the bounded restart rate."""
        while self.failures and now - self.failures[0] > RESTART_WINDOW_S:
            self.failures.popleft()
        if len(self.failures) < RESTARTS_PER_WINDOW:
            return 0.0
        return self.failures[0] + RESTART_WINDOW_S - now


class ReplicaSet:
    """The replicas of one model, their router, and their restarts."""

    def __init__(
        self,
        config: ModelConfig,
        start: StartWorker,
        metrics: EngineMetrics,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.name = config.served_name
        # The router and the requests in flight are the event loop's alone.
        self._loop = loop
        self.config = config
        self._start = start
        self._metrics = metrics.replicas
        self._model_metrics = metrics.bind(config.served_name)
        self.replicas = [Replica(i) for i in range(config.replicas)]
        self.facts: TextFacts | None = None
        self.router: PrefixRouter | None = None
        self._lock = threading.Lock()
        self._closing = False
        self.engine = ReplicaEngine(self)

    # -- starting and stopping ---------------------------------------------------------------

    def start_all(self) -> TextFacts:
        """Start every replica at once and wait until each has loaded the model (a thread);
        the first failure stops the others and is raised."""
        with ThreadPoolExecutor(len(self.replicas)) as pool:
            outcomes = list(pool.map(self._try_start, self.replicas))
        errors = [outcome for outcome in outcomes if isinstance(outcome, BaseException)]
        if errors:
            self.stop()
            raise errors[0]
        facts = outcomes[0]
        assert isinstance(facts, TextFacts)
        self.facts = facts
        self.router = PrefixRouter(
            len(self.replicas),
            capacity_tokens=cache_tokens(self.config, facts),
            imbalance=self.config.replica_imbalance,
            policy=_policy(self.config.replica_routing),
        )
        return facts

    def _try_start(self, replica: Replica) -> TextFacts | BaseException:
        try:
            return self._start_one(replica)
        except Exception as exc:
            return exc

    def _start_one(self, replica: Replica) -> TextFacts:
        def on_exit(worker: Worker, reason: str) -> None:
            self._died(replica, worker, reason)

        part = self._model_metrics.part()
        worker, facts = self._start(self.config, part, on_exit)
        with self._lock:
            if self._closing:
                worker.stop()
                raise WorkerGone(f"the model '{self.name}' is being unloaded")
            replica.worker, replica.engine = worker, RemoteEngine(worker)
            replica.state, replica.reason, replica.metrics = "serving", None, part
        self._metrics.up.labels(self.name, str(replica.index)).set(1)
        logger.info("replica %d of '%s' serves (pid %d)", replica.index, self.name, worker.pid)
        return facts

    def _died(self, replica: Replica, worker: Worker, reason: str) -> None:
        """A replica's process ended on its own (its reader thread): its requests have
        failed; start it again on a thread of its own."""
        with self._lock:
            if replica.worker is not worker or self._closing:
                return
            replica.state, replica.reason, replica.engine = "failed", reason, None
            replica.failures.append(time.monotonic())
        self._metrics.up.labels(self.name, str(replica.index)).set(0)
        if replica.metrics is not None:
            replica.metrics.engine_gone()
        logger.error("replica %d of '%s' failed: %s", replica.index, self.name, reason)
        if self.router is not None:
            # Its caches died with it (a closed loop: the server is ending anyway).
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self.router.forget, replica.index)
        threading.Thread(
            target=self._restart, args=(replica,), name=f"restart-{self.name}", daemon=True
        ).start()

    def _restart(self, replica: Replica) -> None:
        while not self._closing:
            wait = replica.restart_wait(time.monotonic())
            if wait > 0:
                time.sleep(min(wait, 1.0))
                continue
            replica.state = "starting"
            replica.restarts += 1
            self._metrics.restarts.labels(self.name, str(replica.index)).inc()
            try:
                self._start_one(replica)
                return
            except Exception as exc:
                replica.state, replica.reason = "failed", str(exc) or type(exc).__name__
                replica.failures.append(time.monotonic())
                logger.error("replica %d of '%s' did not start: %s", replica.index, self.name, exc)

    def stop(self) -> None:
        """End every replica's process (an unload, or the server's end)."""
        with self._lock:
            self._closing = True
            workers = [r.worker for r in self.replicas if r.worker is not None]
            for replica in self.replicas:
                replica.state, replica.engine = "stopped", None
        for worker in workers:
            worker.stop()
        for replica in self.replicas:
            self._metrics.up.labels(self.name, str(replica.index)).set(0)

    def abort(self, why: str) -> None:
        """End every call and stream in flight on every replica (at the shutdown timeout)."""
        for worker in self._workers():
            worker.abort(why)

    # -- what the registry and serving read, as of a single worker ---------------------------

    def _workers(self) -> list[Worker]:
        with self._lock:
            return [r.worker for r in self.replicas if r.worker is not None]

    def serving(self) -> list[bool]:
        """Whether each replica serves now."""
        return [r.state == "serving" for r in self.replicas]

    @property
    def pid(self) -> int:
        """The first serving replica's process id (each is listed in /v1/models)."""
        serving = [r.worker for r in self.replicas if r.state == "serving" and r.worker]
        return serving[0].pid if serving else -1

    def resident_bytes(self) -> int | None:
        """What the replicas hold together, measured."""
        sizes = [worker.resident_bytes() for worker in self._workers()]
        known = [size for size in sizes if size is not None]
        return sum(known) if known else None

    def call(self, method: str, *args: Any) -> Any:
        """A call to the model (tokenizing, scoring a prompt) on the serving replica with the
        fewest requests: a scoring waits for a free slot."""
        for replica in sorted(self.replicas, key=lambda r: r.in_flight):
            worker = replica.worker
            if replica.state == "serving" and worker is not None:
                try:
                    return worker.call(method, *args)
                except WorkerGone:
                    continue
        raise WorkerGone(self._none_serving())

    def _unavailable(self) -> EngineError:
        return EngineError(f"{self._none_serving()}; retry the request", MODEL_UNAVAILABLE)

    def _none_serving(self) -> str:
        reasons = "; ".join(f"{r.index}: {r.reason or r.state}" for r in self.replicas)
        return f"no replica of the model '{self.name}' is serving ({reasons})"

    def listing(self) -> list[dict[str, Any]]:
        """Each replica as /v1/models shows it."""
        slots = self.facts.n_slots if self.facts is not None else 1
        return [
            {
                "replica": r.index,
                "pid": r.worker.pid if r.worker is not None and r.state == "serving" else None,
                "state": r.state,
                "running": min(r.in_flight, slots),
                "queued": max(0, r.in_flight - slots),
                "cached_prefixes": self.router.cached_prefixes(r.index) if self.router else 0,
                "restarts": r.restarts,
                **({"reason": r.reason} if r.reason and r.state != "serving" else {}),
            }
            for r in self.replicas
        ]

    # -- routing -----------------------------------------------------------------------------

    def route(
        self,
        request_id: str,
        route: RouteRequest,
        count: int,
        method: str,
        args: tuple[object, ...],
    ) -> list[RequestHandle]:
        """Send one request's sequences to the replica the router picks (on the event loop);
        the model's queue counts every replica's requests."""
        assert self.router is not None and self.facts is not None
        serving = self.serving()
        loads = [r.in_flight for r in self.replicas]
        check_room(self.config.queue_size, self.facts.n_slots, sum(serving), sum(loads), count)
        try:
            chosen = self.router.choose(route, loads, serving)
        except NoReplica:
            raise self._unavailable() from None
        replica = self.replicas[chosen.replica]
        engine = replica.engine
        if engine is None:
            raise self._unavailable()
        handles = engine.start(request_id, method, args, count, route)
        self.router.sent(chosen.replica, route)
        self._metrics.decided(self.name, chosen.decision)
        logger.debug(
            "%s: replica %d (%s, %d tokens cached)",
            request_id,
            chosen.replica,
            chosen.decision,
            chosen.matched_tokens,
        )
        replica.in_flight += count
        for handle in handles:
            handle.on_end = lambda event, r=replica: self._ended(r, event)
        self._gauges(replica)
        return list(handles)

    def _ended(self, replica: Replica, event: TokenEvent | None) -> None:
        replica.in_flight = max(0, replica.in_flight - 1)
        if event is not None and event.error is None:
            label = (self.name, str(replica.index))
            self._metrics.prompt.labels(*label).inc(event.prompt_tokens)
            self._metrics.cached.labels(*label).inc(event.cached_tokens)
        self._gauges(replica)

    def _gauges(self, replica: Replica) -> None:
        label = (self.name, str(replica.index))
        slots = self.facts.n_slots if self.facts is not None else 1
        self._metrics.running.labels(*label).set(min(replica.in_flight, slots))
        self._metrics.queued.labels(*label).set(max(0, replica.in_flight - slots))
        if self.router is not None:
            self._metrics.prefixes.labels(*label).set(self.router.cached_prefixes(replica.index))


def cache_tokens(config: ModelConfig, facts: TextFacts) -> int:
    """What one replica's caches hold, in tokens: its slots' contexts, and what --cache-ram
    keeps of KV state at the model's bytes per token."""
    slots = facts.n_slots * facts.n_ctx_seq
    if config.cache_ram_mib < 0:
        return 1 << 30
    kv = facts.kv_cache
    if kv is None or kv.cells <= 0 or config.cache_ram_mib <= 0:
        return slots
    per_token = max(1, (kv.k_bytes + kv.v_bytes) // kv.cells)
    return slots + (config.cache_ram_mib << 20) // per_token


def _policy(name: str) -> Policy:
    return (
        "round-robin"
        if name == "round-robin"
        else "power-of-two"
        if name == "power-of-two"
        else "prefix"
    )


def start_replicas(
    config: ModelConfig,
    setup: Setup,
    metrics: EngineMetrics,
    loop: asyncio.AbstractEventLoop,
    heartbeat_timeout: float = 0.0,
) -> tuple[ReplicaSet, TextFacts]:
    """Start a model's replicas, each with its share of the cores and the heartbeat (a
    thread; raises the first replica's load failure)."""
    config = replace(config, threads=replica_threads(config))
    setup = replace(setup, config=config)

    def start(
        config: ModelConfig, recorded: RecordsMetrics, on_exit: Callable[[Worker, str], None]
    ) -> tuple[Worker, TextFacts]:
        worker, facts = Worker.start(config, setup, recorded, on_exit, heartbeat_timeout)
        return worker, facts

    replicas = ReplicaSet(config, start, metrics, loop)
    return replicas, replicas.start_all()
