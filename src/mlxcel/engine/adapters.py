"""LoRA adapter sets in the engine: what a request runs with, which set a step runs, and the
calls (loading an adapter, unloading one) that must run on the engine thread.

A set is the adapters a sequence runs with and their scales: sorted by name, zero scales left
out, so the base model is the empty set and two spellings of one set compare equal. Both
engines apply one set to a whole forward pass (llama.cpp's adapters belong to the context, and
a switch makes it reserve its compute graph again; the MLX layers hold one active set), so a
step runs the sequences of one set: sequences of the same set batch together, and different
sets take turns of a few steps each (`python bench/lora.py` measures both).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Protocol, TypeVar, runtime_checkable

AdapterSet = tuple[tuple[str, float], ...]
"""(adapter name, scale) pairs, sorted by name, no zero scale; () is the base model."""

ADAPTER_TURN_STEPS = 4
"""Steps one adapter set runs before another set's sequences get theirs: a switch costs
llama.cpp a graph reservation (about a step's time on a small model), so a turn is longer
than one step; short enough that neither set's tokens stall for long."""

T = TypeVar("T")


def adapter_set(scales: Mapping[str, float] | Iterable[tuple[str, float]]) -> AdapterSet:
    """The canonical set for these scales; a scale that is not finite raises ValueError."""
    pairs = scales.items() if isinstance(scales, Mapping) else scales
    kept = {}
    for name, scale in pairs:
        if not math.isfinite(scale):
            raise ValueError(f"the scale of the adapter '{name}' is not a finite number")
        if scale != 0.0:
            kept[name] = float(scale)
    return tuple(sorted(kept.items()))


class LoraAdapters(Protocol):
    """The adapters over one model's weights, loaded while it runs, and the set applied."""

    @property
    def names(self) -> frozenset[str]:
        """The adapters loaded now."""
        ...

    def load(self, name: str, path: Path) -> None:
        """Load an adapter under `name`; ValueError names what is wrong with it."""
        ...

    def unload(self, name: str) -> None:
        """Free an adapter no sequence runs with."""
        ...

    def apply(self, adapters: AdapterSet) -> None:
        """The set the next steps run with."""
        ...


@runtime_checkable
class SwitchesAdapters(Protocol):
    """A generator that runs LoRA adapters over its base weights."""

    @property
    def lora(self) -> LoraAdapters:
        """Its adapters."""
        ...


class AdapterInUse(Exception):
    """An adapter requests run or wait with cannot be unloaded now (409)."""


class Turns:
    """Which adapter set the next step runs: the current one for up to ADAPTER_TURN_STEPS
    steps while another set has sequences running, then the next set in order of arrival."""

    def __init__(self) -> None:
        self._current: AdapterSet | None = None
        self._steps = 0

    def pick(self, running: Sequence[AdapterSet]) -> AdapterSet:
        """The set this step runs, of the sets of the running sequences (one each)."""
        order = list(dict.fromkeys(running))
        current = self._current
        if current in order and (len(order) == 1 or self._steps < ADAPTER_TURN_STEPS):
            self._steps += 1
            return current
        after = order.index(current) + 1 if current in order else 0
        self._current = order[after % len(order)]
        self._steps = 1
        return self._current


class EngineCalls:
    """Calls from other threads that run on the engine thread between steps."""

    def __init__(self) -> None:
        self._pending: list[tuple[Callable[[], Any], Future[Any]]] = []
        self._lock = threading.Lock()

    def submit(self, call: Callable[[], T]) -> Future[T]:
        """Queue `call`; its future holds its result or its exception."""
        future: Future[T] = Future()
        with self._lock:
            self._pending.append((call, future))
        return future

    @property
    def waiting(self) -> bool:
        """Whether a call waits to run."""
        return bool(self._pending)

    def run_pending(self) -> None:
        """Run what was queued (on the engine thread)."""
        with self._lock:
            pending, self._pending = self._pending, []
        for call, future in pending:
            try:
                future.set_result(call())
            except BaseException as exc:
                future.set_exception(exc)

    def cancel_all(self, error: BaseException) -> None:
        """Fail what is still queued (the engine is stopping)."""
        with self._lock:
            pending, self._pending = self._pending, []
        for _, future in pending:
            future.set_exception(error)


def adapter_refusal(generator: object, adapters: AdapterSet) -> str | None:
    """Why a sequence with `adapters` cannot run on `generator` (None: it can)."""
    if not adapters:
        return None
    if not isinstance(generator, SwitchesAdapters):
        return "this model's engine runs no LoRA adapters"
    loaded = generator.lora.names
    missing = [name for name, _ in adapters if name not in loaded]
    return f"the LoRA adapter '{missing[0]}' is not loaded" if missing else None


def names_in_use(sets: Iterable[AdapterSet]) -> set[str]:
    """The adapters that any of these sets runs with."""
    return {name for adapters in sets for name, _ in adapters}
