"""Rank 0 of a group: the generator the scheduler steps, which has every other rank run the
same step, and fails the model, naming the rank, when one does not.

Before each call that touches the model (open a slot, step, forget a slot) rank 0 sends the
call to every other rank over its command link (`links.py`), then runs it itself; the ring
carries the tensors inside the forward pass. Each rank answers each command. A link that ends
(a rank's process died), a rank's `Failed`, a ring error, or a command a rank has not finished
within `rank_timeout` (a rank that stopped answering) all end the same way: `on_broken` with a
reason naming the rank. Its worker then tells the HTTP process and exits, so in-flight requests
get a 503 and the model reloads on a later request; a collective that never returns cannot be
interrupted, which is why the process ends rather than the step.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from mlxcel.backends.group import DistributedConfig, RankAddress
from mlxcel.backends.mlx import links
from mlxcel.backends.mlx.generator import MlxOptions
from mlxcel.backends.mlx.sharded import ShardedGenerator
from mlxcel.engine.types import EngineError, Feed, Sample, SamplingParams

logger = logging.getLogger(__name__)

_WATCH_INTERVAL_S = 0.2
# How long a rank's session process may take to start (its imports) before it joins the ring;
# the ring's join itself is then bounded by the rank timeout.
_START_GRACE_S = 120.0
# After a ring error, how long to wait for a link to say which rank went.
_NAMING_WAIT_S = 2.0


class _Rank:
    """Rank 0's view of another rank: its link and the commands it has not finished."""

    def __init__(self, index: int, address: RankAddress, link: socket.socket) -> None:
        self.index = index
        self.address = address
        self.link = link
        self.pending: deque[tuple[int, float]] = deque()
        self.joining = threading.Event()
        self.joined = threading.Event()

    def __str__(self) -> str:
        return f"rank {self.index} ({self.address.host})"


class LeaderGenerator(ShardedGenerator):
    """Rank 0's part of the model, stepping the group together."""

    def __init__(
        self,
        path: Path,
        options: MlxOptions,
        config: DistributedConfig,
        on_broken: Callable[[str], None],
        log_level: str = "info",
    ) -> None:
        ranks = config.ranks()
        self._timeout = config.rank_timeout
        self._on_broken = on_broken
        self._lock = threading.Lock()
        self._broke = threading.Event()
        self._breaking = threading.Lock()
        self._closing = False
        self._seq = 0
        self._deadline: float | None = None
        self._others = [self._connect(i, rank) for i, rank in enumerate(ranks) if i > 0]
        for other in self._others:
            join = links.Join(
                other.index,
                ranks,
                path,
                options.ctx_size,
                options.parallel,
                options.batch_size,
                config.mode,
                log_level,
            )
            self._send(other, join)
            threading.Thread(target=self._read, args=(other,), daemon=True).start()
        threading.Thread(target=self._watch, name="rank-watchdog", daemon=True).start()
        super().__init__(path, options, ranks, 0, config.mode)
        for other in self._others:
            # Each rank answers once its part is loaded; one that died says so on its link.
            while not other.joined.wait(_WATCH_INTERVAL_S):
                if self._broke.is_set():
                    raise EngineError(f"{other} left while loading", "model_unavailable")

    @property
    def hosts(self) -> tuple[str, ...]:
        """Every rank's ring address, rank 0 first."""
        return tuple(str(rank) for rank in self._ranks)

    def _connect(self, index: int, address: RankAddress) -> _Rank:
        try:
            link = links.connect(address, self._timeout)
        except OSError as exc:
            raise ValueError(
                f"rank {index} ({address.host}:{address.control_port}) is not reachable within "
                f"{self._timeout:g} s: {exc}; start `mlxcel serve --distributed HOSTFILE "
                f"--rank {index}` there first"
            ) from None
        return _Rank(index, address, link)

    # The ring's init blocks until every rank joins: bound it as a command is bounded, once
    # every rank has started.
    def _joining(self) -> None:
        self._deadline = time.monotonic() + _START_GRACE_S
        for other in self._others:
            while not other.joining.wait(_WATCH_INTERVAL_S):
                if self._broke.is_set():
                    raise EngineError(f"{other} left while starting", "model_unavailable")
        self._deadline = time.monotonic() + self._timeout

    def _joined(self) -> None:
        self._deadline = None

    def _send(self, other: _Rank, message: object) -> None:
        try:
            links.send(other.link, message)
        except OSError as exc:
            self._break(f"{other} cannot be reached: {exc}")

    def _broadcast(self, method: str, *args: Any) -> None:
        with self._lock:
            self._seq += 1
            command = links.Command(self._seq, method, args)
            now = time.monotonic()
            for other in self._others:
                other.pending.append((command.seq, now))
                self._send(other, command)

    def open_slot(self, slot: int, params: SamplingParams, *, reuse: int = 0) -> None:
        self._broadcast("open_slot", slot, reuse)
        super().open_slot(slot, params, reuse=reuse)

    def close_slot(self, slot: int) -> None:
        self._broadcast("close_slot", slot)
        super().close_slot(slot)

    def step(self, feeds: Sequence[Feed]) -> list[Sample | None]:
        self._broadcast("step", tuple(feeds))
        try:
            return super().step(feeds)
        except RuntimeError as exc:
            # The ring lost a peer: its link usually says which rank at the same moment.
            self._broke.wait(_NAMING_WAIT_S)
            self._break(f"the ring between the ranks failed: {exc}")
            raise EngineError(str(exc), "model_unavailable") from exc

    def warm_up(self) -> None:
        super().warm_up()
        self._broadcast("forget_slot", 0)

    def close(self) -> None:
        self._closing = True
        self._broadcast("close")
        super().close()
        for other in self._others:
            other.link.close()

    def _read(self, other: _Rank) -> None:
        try:
            while True:
                message = links.receive(other.link)
                if isinstance(message, links.Done):
                    with self._lock:
                        while other.pending and other.pending[0][0] <= message.seq:
                            other.pending.popleft()
                elif isinstance(message, links.Joining):
                    other.joining.set()
                elif isinstance(message, links.Joined):
                    other.joined.set()
                elif isinstance(message, links.Failed):
                    self._break(f"{other} failed: {message.reason}")
                    return
        except (EOFError, OSError):
            if not self._closing:
                self._break(f"{other} closed its link: its process ended or the network failed")

    def _watch(self) -> None:
        while not self._broke.is_set():
            time.sleep(_WATCH_INTERVAL_S)
            now = time.monotonic()
            if self._deadline is not None and now > self._deadline:
                self._break("the ranks did not all start and join the ring in time")
            with self._lock:
                late = [
                    o for o in self._others if o.pending and now - o.pending[0][1] > self._timeout
                ]
            if late and not self._closing:
                self._break(f"{late[0]} did not finish a step within {self._timeout:g} s")

    def _break(self, reason: str) -> None:
        with self._breaking:
            if self._broke.is_set():
                return
            self._broke.set()
        logger.error("the model's group broke: %s", reason)
        self._on_broken(reason)
