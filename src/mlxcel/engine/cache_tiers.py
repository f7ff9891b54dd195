"""The prompt cache's two tiers as the scheduler uses them: host memory (`prompt_cache.py`) over
disk (`disk_cache.py`).

What the RAM tier lets go (for room, or too big for it) is written to disk by a writer thread,
so a request never waits on a write; a request whose prompt shares more with an entry on disk
than with its slot or the RAM tier has that entry loaded, when loading is measured to be faster
than evaluating the tokens it saves (`Crossover`). When the engine stops (SIGTERM, an idle
unload, eviction for memory) the slots' and the RAM tier's states are written out, within a
time bound.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any

from mlxcel.engine.adapters import AdapterSet
from mlxcel.engine.capabilities import SavesState
from mlxcel.engine.disk_cache import DiskCache, DiskEntry
from mlxcel.engine.metrics import RecordsMetrics
from mlxcel.engine.prompt_cache import (
    MIN_SAVED_TOKENS,
    CacheEntry,
    PromptCache,
    keep_slot_state,
    load_cached,
    swap_cached,
)
from mlxcel.engine.slots import SlotState

logger = logging.getLogger(__name__)

# Seconds the engine's stop may spend writing states to disk: the HTTP process kills a worker
# that has not exited 10 s after it asked it to stop (models/remote.py, STOP_TIMEOUT_S).
DRAIN_S = 6.0
# What a load costs besides reading its bytes (open, parse, a backend's set-up): with the
# default model a load of a few dozen tokens measured at 1-2 ms.
LOAD_OVERHEAD_S = 0.002


@dataclass
class Crossover:
    """When loading a state from disk beats evaluating its tokens, from what both cost here:
    seconds per prompt token evaluated, and per byte loaded (read, checked, put in a slot), each
    a running average; until both are measured, loading is assumed to win."""

    prefill_s_per_token: float | None = None
    load_s_per_byte: float | None = None

    @staticmethod
    def _average(old: float | None, new: float) -> float:
        return new if old is None else 0.7 * old + 0.3 * new

    def prefilled(self, tokens: int, seconds: float) -> None:
        """A prompt evaluated `tokens` tokens in `seconds`."""
        if tokens >= MIN_SAVED_TOKENS and seconds > 0:
            self.prefill_s_per_token = self._average(self.prefill_s_per_token, seconds / tokens)

    def loaded(self, n_bytes: int, seconds: float) -> None:
        """A state of `n_bytes` was loaded in `seconds`."""
        if n_bytes > 0:
            self.load_s_per_byte = self._average(self.load_s_per_byte, seconds / n_bytes)

    def worth_loading(self, tokens: int, n_bytes: int) -> bool:
        """Whether loading `n_bytes` is faster than evaluating `tokens`."""
        if self.prefill_s_per_token is None or self.load_s_per_byte is None:
            return True
        load = LOAD_OVERHEAD_S + self.load_s_per_byte * n_bytes
        return load < self.prefill_s_per_token * tokens


def adapter_tag(adapters: AdapterSet) -> str:
    """A disk entry's tag for the LoRA adapter set its state was computed with ("" for the
    base model): only a prompt run with the same set finds it."""
    return json.dumps(adapters) if adapters else ""


class CacheTiers:
    """A model's prompt cache: the RAM tier, and under it the disk tier when there is one."""

    def __init__(self, ram_bytes: int, disk: DiskCache | None = None) -> None:
        self.disk = disk
        self.ram = PromptCache(ram_bytes, self._spill if disk is not None else None)
        self.crossover = Crossover()
        self._writes: queue.Queue[CacheEntry | None] = queue.Queue()
        self._pending: set[tuple[AdapterSet, tuple[int, ...]]] = set()
        self._lock = threading.Lock()
        self._writer: threading.Thread | None = None
        self.disk_loads = 0

    def _spill(self, entry: CacheEntry) -> None:
        """Hand a state the RAM tier lets go to the writer thread."""
        with self._lock:
            self._pending.add(entry.key)
            if self._writer is None:
                self._writer = threading.Thread(target=self._write, name="cache-disk", daemon=True)
                self._writer.start()
        self._writes.put(entry)

    def _write(self) -> None:
        assert self.disk is not None
        while (entry := self._writes.get()) is not None:
            try:
                self.disk.put(entry.tokens, entry.data, adapter_tag(entry.adapters))
            except Exception:
                logger.exception("prompt cache: writing a state to disk failed")
            finally:
                with self._lock:
                    self._pending.discard(entry.key)
                self._writes.task_done()

    def swap(
        self,
        generator: SavesState,
        slot: int,
        state: SlotState,
        shared: int,
        prompt: list[int],
        metrics: RecordsMetrics,
        adapters: AdapterSet = (),
    ) -> int:
        """The prompt tokens slot `slot` holds once the cache had its say: what the slot would
        lose is kept, and the longest saved prefix of `prompt` computed with its adapter set,
        from RAM or disk, is loaded."""
        if self.disk is None:
            return swap_cached(self.ram, generator, slot, state, shared, prompt, metrics, adapters)
        keep_slot_state(self.ram, generator, slot, state, shared)
        _, in_ram = self.ram.best(prompt, adapters)
        entry, on_disk = self._disk_best(prompt, adapters)
        metrics.disk_size(self.disk.entries, self.disk.total_bytes)  # with the writer's work
        on_disk = min(on_disk, len(prompt) - 1)
        better = entry is not None and on_disk > max(in_ram, shared)
        if better and entry is not None:
            worth = self.crossover.worth_loading(on_disk - shared, entry.state_bytes)
            if worth and self._load(generator, slot, entry, metrics):
                metrics.cache_size(self.ram.total_bytes)
                state.tokens = list(entry.tokens)
                return on_disk
        return load_cached(self.ram, generator, slot, state, shared, prompt, metrics, adapters)

    def _disk_best(self, prompt: list[int], adapters: AdapterSet) -> tuple[DiskEntry | None, int]:
        """The disk entry sharing most with `prompt`; states still waiting to be written are
        found in RAM's place, since RAM just let them go."""
        assert self.disk is not None
        with self._lock:
            waiting = list(self._pending)
        if waiting:
            self._writes.join()  # rare: a write this prompt needs is under way
        return self.disk.best(prompt, adapter_tag(adapters))

    def _load(
        self, generator: SavesState, slot: int, entry: DiskEntry, metrics: RecordsMetrics
    ) -> bool:
        assert self.disk is not None
        started = time.monotonic()
        data = self.disk.read(entry)
        if data is None:
            return False
        if not generator.load_state(slot, data):
            logger.warning("a prompt state from disk did not fit its slot; evaluating the prompt")
            return False
        seconds = time.monotonic() - started
        self.crossover.loaded(len(data), seconds)
        self.disk_loads += 1
        metrics.disk_loaded(seconds)
        metrics.disk_size(self.disk.entries, self.disk.total_bytes)
        logger.info(
            "slot %d: %d tokens loaded from the disk prompt cache in %.0f ms",
            slot,
            len(entry.tokens),
            seconds * 1e3,
        )
        return True

    def stats(self) -> dict[str, Any]:
        """Both tiers as /props shows them."""
        answer: dict[str, Any] = {"ram": {"entries": len(self.ram), "bytes": self.ram.total_bytes}}
        disk = self.disk
        if disk is not None:
            answer["disk"] = {
                "path": str(disk.folder),
                "entries": disk.entries,
                "bytes": disk.total_bytes,
                "max_bytes": disk.max_bytes,
                "hits": disk.hits,
                "load_ms": round(disk.load_seconds * 1e3, 3),
                "writes": disk.writes,
            }
        return answer

    def prefilled(self, tokens: int, seconds: float) -> None:
        """A prompt evaluated `tokens` tokens in `seconds` (the crossover's measure)."""
        self.crossover.prefilled(tokens, seconds)

    def drain(self, generator: SavesState, slots: list[SlotState], metrics: RecordsMetrics) -> None:
        """Write every idle slot's state and every RAM entry to disk, newest first, for at
        most DRAIN_S seconds: the engine is stopping and the model may be unloaded."""
        disk = self.disk
        if disk is None:
            return
        deadline = time.monotonic() + DRAIN_S
        started, written, skipped = time.monotonic(), 0, 0
        kept: list[tuple[list[int] | tuple[int, ...], bytes | int, str]] = [
            (s.tokens, index, adapter_tag(s.adapters))
            for index, s in enumerate(slots)
            if not s.busy
        ]
        kept += [(e.tokens, e.data, adapter_tag(e.adapters)) for e in self.ram.newest_first()]
        for tokens, state, tag in kept:
            if len(tokens) < MIN_SAVED_TOKENS or disk.has(tokens, tag):
                continue
            if time.monotonic() > deadline:
                skipped += 1
                continue
            data = generator.save_state(state) if isinstance(state, int) else state
            written += disk.put(tokens, data, tag)
        self._writes.put(None)
        if self._writer is not None:
            self._writer.join(timeout=max(0.0, deadline - time.monotonic()))
        metrics.disk_size(disk.entries, disk.total_bytes)
        if written or skipped:
            logger.info(
                "prompt cache: %d states written to disk in %.1f s%s",
                written,
                time.monotonic() - started,
                f", {skipped} left out for time" if skipped else "",
            )
