"""A model's replicas on a Ray cluster, as the HTTP process holds them (`--ray`).

The model is a Ray Serve application of one deployment whose replicas run the model's worker
(`models/ray_replica.py`), placed by Ray with the model's `ray_actor_options`, `replicas` of
them or as many as `autoscaling` says. `RayWorker` stands where the model's `Worker` stands:
its calls go through the deployment handle to any replica, each request's sequences stream
from the replica that the prefix router (`models/ray_router.py`) picks. A replica that dies
under a request (its worker process, its actor, or the cluster) fails that request with
`WorkerGone`, a 503 `model_unavailable`; Ray starts another and the model stays loaded.
The model's queue counts its sequences on every replica (`RayEngine`), as for local
replicas. While the cluster is lost (`models/ray_link.py`) every request gets the 503 naming
it; once the link has deployed the model again, `rebind` gives it the new handle.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ray import serve

from mlxcel.config.settings import ModelConfig
from mlxcel.engine.handle import ends
from mlxcel.engine.metrics import EngineMetrics
from mlxcel.engine.replica_router import RouteRequest, check_room
from mlxcel.engine.types import EngineError, TokenEvent
from mlxcel.models import ray_link
from mlxcel.models.loaded import LoadedModel, served_model
from mlxcel.models.ray_deploy import app_name, deploy, replica_setup
from mlxcel.models.ray_series import RaySeries
from mlxcel.models.remote import Receiver, Worker, WorkerGone
from mlxcel.models.replicas import cache_tokens
from mlxcel.models.textgen import RemoteEngine, RemoteHandle
from mlxcel.wire.messages import Setup

# Seconds a request may wait for its replica's first item (which it sends on arrival, before
# the model's queue), and a call for its answer, before the cluster counts as lost.
FIRST_ITEM_S = 15.0
CALL_S = 15.0


@dataclass
class _Streams:
    """One request's sequences streaming from one replica."""

    receivers: dict[int, Receiver]
    response: Any = None
    replica: str | None = None
    cancelled: set[int] = field(default_factory=set)


class RayWorker(Worker):
    """A model served by a Ray Serve deployment, seen from the HTTP process."""

    def __init__(self, config: ModelConfig, app: str, handle: Any, metrics: EngineMetrics):
        # No process of its own: the worker processes are the replicas'.
        self.name = config.served_name
        self._config = config
        self.queue_size = config.queue_size
        self._app = app
        self._handle = handle
        self.series = RaySeries(metrics, config.served_name)
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._open: dict[int, _Streams] = {}
        self._aborted: str | None = None
        self._lost: str | None = None
        self._ray_calls: set[Any] = set()
        self.capacity = 1 << 20
        self.route: RouteRequest | None = None
        """The next stream's route (set by `RayEngine.start` on the event loop)."""
        self.replicas: dict[str, dict[str, Any]] = {}

    @property
    def pid(self) -> int:
        """The first serving replica's worker process id (-1 before one has answered)."""
        pids = [r["pid"] for r in self.replicas.values() if r["state"] == "serving"]
        return pids[0] if pids else -1

    def resident_bytes(self) -> int | None:
        """Not measured: the replicas' memory is on their nodes."""
        return None

    def listing(self) -> list[dict[str, Any]]:
        """Each replica that has answered, as /v1/models shows it."""
        with self._lock:
            return [dict(r) for r in self.replicas.values()]

    def serving(self) -> int:
        """Replicas serving now: those that answered and did not fail since, at least as many
        as the model asks for until they have answered (none while the cluster is lost)."""
        if self._lost is not None:
            return 0
        with self._lock:
            answered = sum(r["state"] == "serving" for r in self.replicas.values())
        least = int(self._config.autoscaling.get("min_replicas", self._config.replicas))
        return max(answered, least)

    def lose(self, why: str) -> None:
        """The cluster is lost (`models/ray_link.py`): every stream in flight fails with
        `WorkerGone` naming it, and so does every request until `rebind`."""
        with self._lock:
            self._lost = why
            every = {id(s): s for s in self._open.values()}
            for replica, known in self.replicas.items():
                known.update(state="failed", reason=why, running=0)
                self.series.show(replica, False, 0)
            calls = list(self._ray_calls)
        for call in calls:
            with contextlib.suppress(Exception):
                call.cancel()
        for streams in every.values():
            if streams.response is not None:
                streams.response.cancel()
            self._fail(streams, WorkerGone(why))

    def release(self) -> None:
        """Shut the handle's router down (its tasks would poll the lost cluster's replicas);
        at most a few seconds."""
        done = threading.Thread(target=self._handle.shutdown, daemon=True)
        done.start()
        done.join(5)

    def rebind(self, handle: Any) -> None:
        """The model deployed again on the cluster come back: requests go to its new
        replicas."""
        with self._lock:
            self._handle, self._lost = handle, None
            for replica in self.replicas:
                self.series.forget(replica)
            self.replicas.clear()

    def call(self, method: str, *args: Any) -> Any:
        """Call a method of the model on any replica and wait for its result."""
        self._check_open()
        response = None
        try:
            response = self._handle.options(method_name="call").remote(method, args)
            with self._lock:
                self._ray_calls.add(response)
            return response.result(timeout_s=CALL_S, _skip_asyncio_check=True)
        except Exception as exc:
            if response is not None:
                # Unanswered, Ray's router would go on trying to place it (on a lost
                # cluster's replicas: for ever).
                with contextlib.suppress(Exception):
                    response.cancel()
            if self._lost is not None:
                raise WorkerGone(self._lost) from None
            raise self._failure(exc) from None
        finally:
            with self._lock:
                self._ray_calls.discard(response)

    def stream(
        self, method: str, args: tuple[Any, ...], receivers: Sequence[Receiver]
    ) -> list[int]:
        """Start the sequences together on the replica the router picks; their items go to
        their receivers (from a thread of their own)."""
        with self._lock:
            self._check_open()
            ids = [next(self._ids) for _ in receivers]
            streams = _Streams(dict(zip(ids, receivers, strict=True)))
            for stream_id in ids:
                self._open[stream_id] = streams
        route, self.route = self.route, None
        threading.Thread(
            target=self._pump,
            args=(streams, method, args, route),
            name=f"ray-{self.name}",
            daemon=True,
        ).start()
        return ids

    def _pump(
        self, streams: _Streams, method: str, args: tuple[Any, ...], route: RouteRequest | None
    ) -> None:
        ids = list(streams.receivers)
        try:
            options = self._handle.options(stream=True, method_name="stream")
            kwargs = {"route": route, "capacity": self.capacity} if route is not None else {}
            streams.response = options.remote(method, args, len(ids), **kwargs)
            if streams.cancelled:
                streams.response.cancel()
            watchdog = threading.Timer(FIRST_ITEM_S, self._unanswered, (streams,))
            watchdog.daemon = True
            watchdog.start()
            for item in streams.response:
                if isinstance(item, dict):
                    self._answered(streams, item)
                    continue
                index, value, error, records = item
                if streams.replica is not None:
                    self.series.record(streams.replica, records)
                receiver = self._take(ids[index], streams, ends=error is not None)
                if receiver is None:
                    continue
                if error is not None:
                    self._replica_failed(streams, error)
                    receiver.fail(error)
                else:
                    last = ends(value)
                    if last and streams.replica is not None:
                        # Counted before the client can see the end.
                        self.series.ended(streams.replica, value)
                    receiver.deliver(value)
                    if last:
                        self._take(ids[index], streams, ends=True)
        except Exception as exc:
            if len(streams.cancelled) < len(ids):
                self._fail(streams, self._failure(exc), failed=True)
        finally:
            self._fail(streams, WorkerGone(f"a replica of '{self.name}' ended the stream"))
            self._done(streams)

    def _unanswered(self, streams: _Streams) -> None:
        """No replica took the request in time: the cluster is lost (Ray would retry for as
        long as it is)."""
        if streams.replica is None and streams.receivers:
            self._fail(streams, WorkerGone(f"the Ray cluster did not answer in {FIRST_ITEM_S:g} s"))
            streams.response.cancel()

    def _answered(self, streams: _Streams, replica: dict[str, Any]) -> None:
        """The replica's first item: which one it is."""
        streams.replica = replica["replica"]
        decision = replica.pop("decision", None)
        if decision is not None:
            self.series.decided(decision)
        with self._lock:
            if replica["replica"] not in self.replicas:
                # A new replica: those that failed have been replaced.
                for key in [k for k, r in self.replicas.items() if r["state"] == "failed"]:
                    del self.replicas[key]
                    self.series.forget(key)
            known = self.replicas.setdefault(replica["replica"], {"running": 0})
            known.update(replica, state="serving")
            known.pop("reason", None)
            known["running"] += 1
            self.series.show(replica["replica"], True, known["running"])

    def _done(self, streams: _Streams) -> None:
        if streams.replica is not None:
            with self._lock:
                known = self.replicas[streams.replica]
                known["running"] = max(0, known["running"] - 1)
                self.series.show(streams.replica, known["state"] == "serving", known["running"])

    def _take(self, stream_id: int, streams: _Streams, ends: bool) -> Receiver | None:
        with self._lock:
            receiver = streams.receivers.get(stream_id)
            if ends:
                streams.receivers.pop(stream_id, None)
                self._open.pop(stream_id, None)
        return receiver

    def _fail(self, streams: _Streams, error: BaseException, failed: bool = False) -> None:
        """End the sequences still open (not those cancelled); `failed`: their replica or
        the cluster failed under them."""
        with self._lock:
            receivers = {i: r for i, r in streams.receivers.items() if i not in streams.cancelled}
            for stream_id in streams.receivers:
                self._open.pop(stream_id, None)
            streams.receivers = {}
        if failed:
            self._replica_failed(streams, error)
        for receiver in receivers.values():
            receiver.fail(error)

    def _replica_failed(self, streams: _Streams, error: BaseException) -> None:
        """A replica's worker, or its actor, ended under a request: Ray replaces it."""
        with self._lock:
            known = self.replicas.get(streams.replica or "")
            if isinstance(error, WorkerGone) and known is not None:
                known.update(state="failed", reason=str(error))
                self.series.show(known["replica"], False, known["running"])

    def _failure(self, exc: Exception) -> Exception:
        """What a request gets for Ray's error: the model's own error as it raised it, or
        `WorkerGone` (503 model_unavailable) naming what ended."""
        if isinstance(exc, TimeoutError):
            return WorkerGone(f"the Ray cluster did not answer in {CALL_S:g} s")
        cause = getattr(exc, "cause", None)
        if isinstance(cause, EngineError | WorkerGone):
            return cause
        if isinstance(exc, EngineError | WorkerGone):
            return exc
        words = (str(cause or exc).strip().splitlines() or [type(exc).__name__])[0]
        return WorkerGone(f"the replica of the model '{self.name}' on Ray failed: {words}")

    def cancel(self, stream_id: int) -> None:
        """Stop a sequence; its request's stream stops once each of its sequences has."""
        with self._lock:
            streams = self._open.get(stream_id)
            if streams is None:
                return
            streams.cancelled.add(stream_id)
            every = streams.cancelled >= set(streams.receivers)
        if every and streams.response is not None:
            streams.response.cancel()

    def _check_open(self) -> None:
        if self._aborted is not None:
            raise EngineError(self._aborted, "shutting_down")
        if self._lost is not None:
            raise WorkerGone(self._lost)

    def abort(self, why: str) -> None:
        """End every stream in flight with a `shutting_down` error."""
        with self._lock:
            self._aborted = why
            every = {id(s): s for s in self._open.values()}
        for streams in every.values():
            if streams.response is not None:
                streams.response.cancel()
            self._fail(streams, EngineError(why, "shutting_down"))

    def stop(self) -> None:
        """Delete the model's application: Ray ends its replicas (a lost cluster has none)."""
        ray_link.unwatch(self)
        if self._lost is None:
            serve.delete(self._app)


class RayEngine(RemoteEngine):
    """The scheduler of a model on Ray: each request's route travels with its stream, for the
    prefix router."""

    def __init__(self, worker: RayWorker, slots: int) -> None:
        super().__init__(worker)
        self._ray = worker
        self._slots = slots
        self._in_flight = 0
        """Sequences started and not ended, on every replica (on the event loop)."""

    def start(
        self,
        request_id: str,
        method: str,
        args: tuple[object, ...],
        count: int,
        route: RouteRequest,
    ) -> list[RemoteHandle]:
        """Start the sequences on the replica the router picks for `route`; the model's
        queue counts every replica's requests, as for local replicas."""
        serving = self._ray.serving()
        check_room(self._ray.queue_size, self._slots, serving, self._in_flight, count)
        self._ray.route = route
        handles = super().start(request_id, method, args, count, route)
        self._in_flight += count
        for handle in handles:
            handle.on_end = self._ended
        return handles

    def _ended(self, event: TokenEvent | None) -> None:
        self._in_flight = max(0, self._in_flight - 1)


def ray_model(
    config: ModelConfig, setup: Setup, metrics: EngineMetrics, start_timeout: float
) -> LoadedModel:
    """Deploy the model's replicas on Ray and wait until they serve, at most `start_timeout`
    seconds (a thread); raises the deployment's failure. The server's link to the cluster
    deploys them again should the cluster be lost and come back."""
    ray_link.check()
    setup = replica_setup(config, setup)
    config = setup.config
    handle, facts = deploy(config, setup, start_timeout)
    worker = RayWorker(config, app_name(config), handle, metrics)
    worker.capacity = cache_tokens(config, facts)
    worker.series.slots = facts.n_slots
    model = served_model(config, worker, facts)
    model.scheduler = RayEngine(worker, facts.n_slots)
    ray_link.watch(worker, lambda: deploy(config, setup, start_timeout)[0])
    return model
