"""A rank past 0 of a model's group: `mlxcel serve --distributed HOSTFILE --rank N`.

It serves no HTTP. It listens for rank 0's command link on its hostfile address only, and
takes links from rank 0's address only; each link is one session, run in a fresh process
(`python -m mlxcel.worker.rank FD`): join the ring, load this rank's part of the model, then run
each command rank 0 sends, in order, answering each. A session ends with its link (rank 0's
worker stopped, or died and will reload), and the next link starts a new one, so a model that
failed on rank 0 reloads on a later request without touching this machine.
"""

from __future__ import annotations

import logging
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
from typing import Any

from mlxcel.backends.group import RankAddress

logger = logging.getLogger(__name__)

_FOLLOWED = frozenset({"open_slot", "close_slot", "step", "forget_slot", "close"})


def serve_rank(ranks: tuple[RankAddress, ...], rank: int) -> int:
    """Take rank 0's sessions one after another, until interrupted."""
    me, leader = ranks[rank], ranks[0]
    try:
        listener = socket.create_server((me.host, me.control_port))
    except OSError as exc:
        logger.error("rank %d cannot listen on %s:%d: %s", rank, me.host, me.control_port, exc)
        return 2
    logger.info(
        "rank %d of %d: waiting for rank 0 (%s) on %s:%d", rank, len(ranks), leader.host,
        me.host, me.control_port,
    )  # fmt: skip
    session: subprocess.Popen[bytes] | None = None
    try:
        while True:
            link, (peer, _port, *_) = listener.accept()
            if peer != leader.host:
                logger.warning(
                    "refused a link from %s: only rank 0 (%s) may connect", peer, leader.host
                )
                link.close()
                continue
            if session is not None and session.poll() is None:
                # A new link means rank 0 started over: the old session's ring is gone.
                session.kill()
                session.wait()
            with link:
                session = subprocess.Popen(
                    [sys.executable, "-m", "mlxcel.worker.rank", str(link.fileno())],
                    pass_fds=(link.fileno(),),
                )
            logger.info("rank %d: rank 0 connected; session process %d", rank, session.pid)
    except KeyboardInterrupt:
        return 0
    finally:
        listener.close()
        if session is not None and session.poll() is None:
            session.kill()
            session.wait()


def _session(fd: int) -> None:
    """One session's process: join, load, follow rank 0's commands until its link ends."""
    from mlxcel.backends.mlx import links

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    link = socket.socket(fileno=fd)
    join = links.receive(link)
    if not isinstance(join, links.Join):
        os._exit(2)
    logging.basicConfig(level=join.log_level.upper(), format=f"rank {join.rank}: %(message)s")
    commands: queue.SimpleQueue[Any] = queue.SimpleQueue()
    threading.Thread(target=_listen, args=(link, commands), daemon=True).start()
    try:
        from mlxcel.backends.mlx.generator import MlxOptions
        from mlxcel.backends.mlx.sharded import ShardedGenerator  # the slow imports, first

        links.send(link, links.Joining(join.rank))
        options = MlxOptions(join.ctx_size, join.parallel, join.batch_size)
        generator = ShardedGenerator(join.model, options, join.ranks, join.rank, join.mode)
    except Exception as exc:
        links.send(link, links.Failed(f"could not load its part: {exc}"))
        os._exit(1)
    links.send(link, links.Joined(join.rank))
    while True:
        command = commands.get()
        try:
            _run(generator, command)
        except Exception as exc:
            logger.exception("command %s failed", command.method)
            links.send(link, links.Failed(f"{command.method} failed: {exc}"))
            os._exit(1)
        links.send(link, links.Done(command.seq))
        if command.method == "close":
            os._exit(0)


def _listen(link: socket.socket, commands: queue.SimpleQueue[Any]) -> None:
    """Read rank 0's commands; when its link ends, end this process at once, whatever the
    model is doing (a collective whose peer went away may never return)."""
    from mlxcel.backends.mlx import links

    try:
        while True:
            message = links.receive(link)
            if isinstance(message, links.Command) and message.method in _FOLLOWED:
                commands.put(message)
    except Exception as exc:  # the link's end, or a message no rank 0 sends
        logger.info("rank 0's link ended (%s): leaving the group", exc or "closed")
    os._exit(0)


def _run(generator: Any, command: Any) -> None:
    from mlxcel.engine.types import SamplingParams

    if command.method == "open_slot":
        slot, reuse = command.args
        # Rank 0 samples for the group; here the sample is thrown away, so take the cheapest.
        greedy = SamplingParams(max_tokens=1, temperature=0, top_p=1, top_k=0, min_p=0)
        generator.open_slot(slot, greedy, reuse=reuse)
    elif command.method == "close":
        generator.close()
    else:
        getattr(generator, command.method)(*command.args)


if __name__ == "__main__":
    _session(int(sys.argv[1]))
