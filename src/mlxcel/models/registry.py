"""Every configured model, its state, and the lookups and lifecycle routes go through.

A route asks for a model by name and capability; the registry answers with a loaded model,
loading it first when it is on demand or was unloaded, and holds a lease on it until the
request is done so that it is never unloaded under a request. Each loaded model lives in a
worker process of its own (`models/remote.py`): loading starts it, unloading ends it, and one
that dies is `failed` until its next request starts it again. All state changes happen on the
event loop; starting and stopping workers run on a thread.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Iterable
from contextlib import nullcontext

from mlxcel.config.settings import ModelConfig
from mlxcel.engine.metrics import EngineMetrics
from mlxcel.memory import mib
from mlxcel.models.entry import (
    RESTART_WINDOW_S,
    RESTARTS_PER_WINDOW,
    MissingCapability,
    ModelBusy,
    ModelEntry,
    ModelNotFound,
    ModelUnavailable,
    NoRoom,
)
from mlxcel.models.loaded import (
    CAPABILITY_FLAGS,
    CAPABILITY_NAMES,
    Capability,
    Loaded,
    LoadedModel,
    served,
)
from mlxcel.models.ray_cluster import replicated_model
from mlxcel.models.remote import Worker
from mlxcel.wire.messages import Setup

logger = logging.getLogger(__name__)

DEFAULT_MODEL_NAMES = frozenset({"default", ""})
# Unknown model names logged (each once) before the log stops naming new ones.
_LOGGED_STAND_INS = 64
# How often the idle watcher looks, at most and at least.
IDLE_POLL_MAX_S = 1.0
IDLE_POLL_MIN_S = 0.05


class ModelRegistry:
    """The models of this server; the first with a capability is what `default` means."""

    def __init__(
        self,
        configs: Iterable[ModelConfig],
        metrics: EngineMetrics,
        *,
        lenient: bool = False,
        max_memory: int | None = None,
        log_level: str = "info",
        log_format: str = "text",
        worker_timeout: float = 0.0,
    ) -> None:
        self._entries = [ModelEntry(config) for config in configs]
        self._metrics = metrics
        self._lenient = lenient
        """One model of a capability serves requests that name an unknown model."""
        self._stand_ins: set[str] = set()
        self._max_memory = max_memory
        self._logging = (log_level, log_format)
        self._worker_timeout = worker_timeout
        # One load at a time: each is measured alone, and each decides about room alone.
        self._load_lock = asyncio.Lock()

    def add(self, config: ModelConfig) -> ModelEntry:
        """A model added while the server runs (POST /models/load with a path); ValueError if
        one of its names is taken."""
        if any(e.answers_to(name) for name in config.names for e in self._entries):
            raise ValueError(f"a model is already served as one of {', '.join(config.names)}")
        self._entries.append(entry := ModelEntry(config))
        return entry

    def entries(self) -> list[ModelEntry]:
        """Every configured model, first one first."""
        return list(self._entries)

    def loaded(self) -> list[Loaded]:
        """Every loaded model."""
        return [e.model for e in self._entries if e.model is not None]

    def served_names(self) -> list[str]:
        """Every name a request may use, for error messages."""
        return [name for entry in self._entries for name in entry.config.names]

    def find(self, name: str | None, capability: Capability) -> ModelEntry:
        """The model a request's `model` field means for a route that needs `capability`."""
        able = [e for e in self._entries if capability in e.capabilities]
        if not able:
            raise MissingCapability(
                f"no model here does {CAPABILITY_NAMES[capability]}; start the server with "
                f"{CAPABILITY_FLAGS[capability]} (or a --config model of that kind); served: "
                f"{self._listing()}"
            )
        if name is None or name in DEFAULT_MODEL_NAMES:
            return able[0]
        entry = next((e for e in self._entries if e.answers_to(name)), None)
        if entry is None:
            if self._lenient and len(able) == 1:
                self._log_stand_in(name, able[0])
                return able[0]
            return self.named(name)
        if capability not in entry.capabilities:
            raise MissingCapability(
                f"the model '{name}' cannot do {CAPABILITY_NAMES[capability]}; it serves "
                f"{', '.join(CAPABILITY_NAMES[c] for c in entry.capabilities)}"
            )
        return entry

    def _log_stand_in(self, name: str, entry: ModelEntry) -> None:
        if name not in self._stand_ins and len(self._stand_ins) < _LOGGED_STAND_INS:
            self._stand_ins.add(name)
            logger.info(
                "requests for model '%s' are served by '%s' (--strict-model-names: 404 instead)",
                name,
                entry.name,
            )

    def named(self, name: str) -> ModelEntry:
        """The model with this name or alias (or file path or file name), whatever it does;
        `default` is the first model, as a request's `model` field means it."""
        entry = next((e for e in self._entries if e.answers_to(name)), None)
        if entry is None and name in DEFAULT_MODEL_NAMES and self._entries:
            entry = self._entries[0]
        if entry is None:
            raise ModelNotFound(f"the model '{name}' does not exist; served: {self._listing()}")
        return entry

    def _listing(self) -> str:
        return f"{', '.join(self.served_names()) or 'none'} (see GET /v1/models)"

    async def acquire(self, entry: ModelEntry) -> Loaded:
        """The loaded model, loading it first if need be; hold it until `release`.

        Waiting for a load counts against the model's queue timeout.
        """
        entry.leases += 1
        entry.last_used = time.monotonic()
        try:
            timeout = entry.config.queue_timeout or None
            return await asyncio.wait_for(self._loaded(entry), timeout)
        except asyncio.TimeoutError:
            entry.leases -= 1
            raise ModelUnavailable(
                f"the model '{entry.name}' did not finish loading within "
                f"{entry.config.queue_timeout:g}s"
            ) from None
        except BaseException:
            entry.leases -= 1
            raise

    def release(self, entry: ModelEntry) -> None:
        """A request is done with the model."""
        entry.leases -= 1
        entry.last_used = time.monotonic()

    async def _loaded(self, entry: ModelEntry) -> Loaded:
        while True:
            if entry.model is not None and entry.state == "loaded":
                return entry.model
            if entry.task is not None:
                error = await asyncio.shield(entry.task)
                if error is not None:
                    raise ModelUnavailable(error)
                continue
            now = time.monotonic()
            if entry.state == "failed" and not entry.may_restart(now):
                wait = entry.restart_in(now)
                raise ModelUnavailable(
                    f"the model '{entry.name}' failed {RESTARTS_PER_WINDOW} times within "
                    f"{RESTART_WINDOW_S:g}s, last: {entry.reason}; it may restart in "
                    f"{math.ceil(wait)}s",
                    retry_after=wait,
                )
            entry.task = asyncio.ensure_future(self._load(entry))

    async def _load(self, entry: ModelEntry) -> str | None:
        entry.state = "loading"
        try:
            # The memory budget is checked against what is loaded, so with one, loads take
            # turns; without one, each model loads in its own worker at once.
            async with self._load_lock if self._max_memory is not None else nullcontext():
                await self._make_room(entry)
                started = time.monotonic()
                logger.info("loading model '%s'", entry.name)
                model, size = await self._open(entry)
                if self._max_memory is not None and size is not None:
                    await self._fit_measured(entry, model, size)
        except NoRoom as exc:
            entry.state = "unloaded"
            logger.warning("%s", exc)
            return str(exc)
        except Exception as exc:
            entry.state, entry.reason = "failed", str(exc) or type(exc).__name__
            entry.failures.append(time.monotonic())
            logger.error("could not load model '%s': %s", entry.name, entry.reason)
            return f"the model '{entry.name}' failed to load: {entry.reason}"
        finally:
            entry.task = None
        entry.size = size or entry.size
        entry.model, entry.state, entry.reason = model, "loaded", None
        size_text = f", resident {mib(entry.size)}" if entry.size is not None else ""
        logger.info(
            "loaded model '%s' in %.1fs (worker pid %d%s)",
            entry.name,
            time.monotonic() - started,
            model.worker.pid,
            size_text,
        )
        return None

    async def _open(self, entry: ModelEntry) -> tuple[Loaded, int | None]:
        """Load the model in a worker process of its own and measure what it takes."""
        loop = asyncio.get_running_loop()
        model = await asyncio.to_thread(self._start_worker, entry, loop)
        return model, model.worker.resident_bytes()

    def _start_worker(self, entry: ModelEntry, loop: asyncio.AbstractEventLoop) -> Loaded:
        """Start the model's worker process and wait for the model to load there (a thread)."""
        config = entry.adapters.configured(entry.config)

        def on_exit(worker: Worker, reason: str) -> None:
            loop.call_soon_threadsafe(self._died, entry, worker, reason)

        setup = Setup(config, *self._logging)
        kind, timeout = entry.capabilities[0], self._worker_timeout
        model: Loaded | None = replicated_model(config, kind, setup, self._metrics, loop, timeout)
        if model is None:
            worker, facts = Worker.start(
                config, setup, self._metrics.bind(entry.name), on_exit, self._worker_timeout
            )
            model = served(config, worker, facts)
        if isinstance(model, LoadedModel):
            model.adapters = entry.adapters
        return model

    def _died(self, entry: ModelEntry, worker: Worker, reason: str) -> None:
        """A loaded model's worker ended on its own: the model failed; its next request
        starts it again (within the bounded restart rate)."""
        model = entry.model
        if model is None or model.worker is not worker:
            return
        entry.model, entry.state, entry.reason = None, "failed", reason
        entry.failures.append(time.monotonic())
        # /metrics showed the dead worker's last counts until the model loaded again.
        self._metrics.bind(entry.name).engine_gone()
        logger.error("model '%s' failed: %s", entry.name, reason)
        # What the model kept in this process (an encoder's batcher thread, an image model's
        # queue) goes with it.
        asyncio.get_running_loop().run_in_executor(None, model.close)

    async def _fit_measured(self, entry: ModelEntry, model: Loaded, size: int) -> None:
        """A first load is sized from the model's file, which is less than a worker holds:
        measured, the model must fit beside the others, evicting idle ones as for any load,
        or it does not stay (NoRoom)."""
        entry.size = size
        try:
            await self._make_room(entry, size)
        except NoRoom:
            await asyncio.to_thread(model.close)
            raise

    async def _make_room(self, entry: ModelEntry, need: int | None = None) -> None:
        """Unload idle unpinned models, least recently used first, until `entry` (`need`
        bytes, by default what it is expected to take) fits the memory budget; NoRoom if it
        cannot."""
        budget = self._max_memory
        if budget is None:
            return
        need = self._expected_size(entry) if need is None else need
        if need > budget:
            # No eviction can make room: leave the other models loaded.
            raise NoRoom(self._never_fits(entry, need))
        while True:
            holders = [e for e in self._entries if e.state in ("loaded", "unloading")]
            held = sum(e.expected_size for e in holders)
            if held + need <= budget:
                return
            idle = sorted((e for e in holders if e.evictable), key=lambda e: e.last_used)
            if not idle:
                raise NoRoom(self._no_room(entry, need, held, holders))
            await self.unload(idle[0], f"making room for '{entry.name}'")

    def _expected_size(self, entry: ModelEntry) -> int:
        """What loading `entry` will take: its own measured size, else one measured for the
        same weights under another name (a worker's resident memory is more than its weights
        on disk), else its weights on disk."""
        if entry.size is None:
            same = (e.size for e in self._entries if e.config.model == entry.config.model)
            measured = [size for size in same if size is not None]
            if measured:
                return max(measured)
        return entry.expected_size

    def _never_fits(self, entry: ModelEntry, need: int) -> str:
        return (
            f"not enough memory for the model '{entry.name}': it takes about {mib(need)} "
            f"loaded, more than the whole --max-memory of {mib(self._max_memory or 0)}"
        )

    def _no_room(self, entry: ModelEntry, need: int, held: int, holders: list[ModelEntry]) -> str:
        def why(e: ModelEntry) -> str:
            if e.config.pinned:
                return "pinned"
            return f"{e.leases} request(s)" if e.leases else e.state

        listed = ", ".join(f"'{e.name}' {mib(e.expected_size)} ({why(e)})" for e in holders)
        return (
            f"not enough memory for the model '{entry.name}': it needs about {mib(need)}, "
            f"--max-memory is {mib(self._max_memory or 0)} and {mib(held)} is held by {listed}"
        )

    async def load(self, entry: ModelEntry) -> None:
        """Load the model now (POST /models/load); nothing to do if it is loaded."""
        await self.acquire(entry)
        self.release(entry)

    async def unload(self, entry: ModelEntry, why: str = "asked to") -> None:
        """Unload the model, ending its engine; raises ModelBusy while requests hold it."""
        while entry.task is not None:
            await asyncio.shield(entry.task)
        if entry.leases:
            raise ModelBusy(
                f"the model '{entry.name}' has {entry.leases} request(s) running or queued"
            )
        if entry.model is None:
            return
        entry.task = asyncio.ensure_future(self._unload(entry, why))
        await asyncio.shield(entry.task)

    async def _unload(self, entry: ModelEntry, why: str) -> str | None:
        model, entry.model, entry.state = entry.model, None, "unloading"
        started = time.monotonic()
        try:
            if model is not None:
                await asyncio.to_thread(model.close)
        finally:
            entry.state, entry.task = "unloaded", None
        freed = f", {mib(entry.size)} freed" if entry.size is not None else ""
        logger.info(
            "unloaded model '%s' (%s) in %.1fs%s",
            entry.name,
            why,
            time.monotonic() - started,
            freed,
        )
        return None

    async def start_up(self) -> None:
        """Load every model that is not on demand (side by side unless a memory budget makes
        them take turns); raise the first failure, in the order the models are given."""
        loads = [self._loaded(e) for e in self._entries if not e.config.on_demand]
        for outcome in await asyncio.gather(*loads, return_exceptions=True):
            if isinstance(outcome, BaseException):
                raise outcome

    async def watch_idle(self) -> None:
        """Forever: unload each model idle for longer than its idle timeout (unless pinned);
        a request's keep_alive may set one for a model that has none."""
        while True:
            timeouts = [e.idle_timeout for e in self._entries if not e.config.pinned]
            shortest = min((t for t in timeouts if t > 0), default=4 * IDLE_POLL_MAX_S)
            await asyncio.sleep(min(IDLE_POLL_MAX_S, max(IDLE_POLL_MIN_S, shortest / 4)))
            now = time.monotonic()
            for entry in self._entries:
                timeout = entry.idle_timeout
                if (
                    timeout > 0
                    and not entry.config.pinned
                    and entry.state == "loaded"
                    and entry.task is None
                    and entry.leases == 0
                    and now - entry.last_used >= timeout
                ):
                    await self.unload(entry, f"idle for {timeout:g}s")

    def close(self) -> None:
        """End every worker process (at shutdown)."""
        for entry in self._entries:
            if entry.model is not None:
                entry.model.close()
                entry.model, entry.state = None, "unloaded"
