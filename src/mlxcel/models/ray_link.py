"""The server's link to its Ray cluster (`--ray`): joined at start, then watched.

Lost mid-run (its GCS stops answering, or another cluster answers at its address: a head
restarted without GCS fault tolerance is a new cluster, whose actors and applications are
not ours), every model on it fails its requests in flight and answers 503
`model_unavailable` naming the cluster, the server stays up, and the link tries to join the
cluster again: each try logged, at growing intervals of at most `RETRY_S[-1]` seconds, for as
long as the server runs. Once the cluster answers, the driver leaves the lost one
(`ray.shutdown`, which Ray allows after its GCS is gone), joins again (`ray.init`), starts
Serve and deploys each model again, and the models serve from their new replicas; nothing in
the HTTP process restarts. A head that comes back with the same cluster (GCS fault
tolerance) needs none of this: Ray's own driver reconnects.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import ray
from ray import serve

logger = logging.getLogger(__name__)

# The Ray namespace the deployments live in.
NAMESPACE = "mlxcel"
# Seconds between checks of the cluster; refused checks in a row before it counts as lost.
CHECK_S = 2.0
LOST_AFTER = 2
# Seconds between tries to join a lost cluster again.
RETRY_S = (1.0, 2.0, 4.0, 8.0, 15.0)
PROBE_S = 2.0


class Watched(Protocol):
    """A model on the cluster (`models/ray_worker.RayWorker`)."""

    name: str

    def lose(self, why: str) -> None: ...

    def release(self) -> None: ...

    def rebind(self, handle: Any) -> None: ...


@dataclass
class _Model:
    worker: Watched
    redeploy: Callable[[], Any]


def join(address: str) -> None:
    """Join the cluster as a driver in the mlxcel namespace and start Ray Serve there
    without its HTTP proxy (this server is the ingress)."""
    ray.init(
        address=address,
        namespace=NAMESPACE,
        log_to_driver=False,
        logging_level=logging.WARNING,
        configure_logging=False,
    )
    serve.start(proxy_location="Disabled")


def answers(gcs: str, timeout: float = PROBE_S) -> bool:
    """Whether the port at host:port takes a connection."""
    host, _, port = gcs.rpartition(":")
    try:
        socket.create_connection((host.strip("[]") or "127.0.0.1", int(port)), timeout).close()
    except (OSError, ValueError):
        return False
    return True


def _cluster_id(gcs: str) -> str:
    """The id of the cluster whose GCS answers at `gcs` (a client of its own: the driver's
    would wait for the lost one)."""
    from ray._raylet import GcsClient  # type: ignore[attr-defined]

    return str(GcsClient(address=gcs).cluster_id.hex())


class Link:
    """The cluster this server joined, and the models it deployed there."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.lost: str | None = None
        self._gcs: str | None = None
        self._cluster: str | None = None
        self._models: dict[int, _Model] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()

    def start(self) -> None:
        """Note the cluster joined and watch it (a daemon thread)."""
        self._gcs = ray.get_runtime_context().gcs_address
        self._cluster = _cluster_id(self._gcs)
        threading.Thread(target=self._run, name="ray-link", daemon=True).start()

    def watch(self, worker: Watched, redeploy: Callable[[], Any]) -> None:
        with self._lock:
            self._models[id(worker)] = _Model(worker, redeploy)

    def unwatch(self, worker: Watched) -> None:
        with self._lock:
            self._models.pop(id(worker), None)

    def _run(self) -> None:
        misses = 0
        while not self._stop.wait(CHECK_S):
            why = self._check()
            if why is None:
                misses = 0
                continue
            misses += 1
            if misses >= LOST_AFTER or why.startswith("another"):
                self._lose(why)
                self._rejoin()
                misses = 0

    def _check(self) -> str | None:
        """Why the cluster is lost, or None while it answers."""
        assert self._gcs is not None
        if not answers(self._gcs):
            return f"its GCS at {self._gcs} does not answer"
        try:
            cluster = _cluster_id(self._gcs)
        except Exception as exc:
            return f"its GCS at {self._gcs} does not answer: {_line(exc)}"
        if cluster != self._cluster:
            return f"another cluster answers at {self._gcs}: the head was restarted"
        return None

    def _lose(self, why: str) -> None:
        self.lost = (
            f"the Ray cluster at {self.address} is lost ({why}); "
            "the server joins it again when it is back"
        )
        logger.error("%s", self.lost)
        for model in self._watched():
            model.worker.lose(self.lost)

    def _watched(self) -> list[_Model]:
        with self._lock:
            return list(self._models.values())

    def _rejoin(self) -> None:
        """Join the cluster again once it answers and deploy every model there again."""
        assert self._gcs is not None
        tries = 0
        while not self._stop.is_set():
            wait = RETRY_S[min(tries, len(RETRY_S) - 1)]
            tries += 1
            if not answers(self._gcs):
                logger.warning(
                    "the Ray cluster at %s does not answer yet (try %d); next try in %gs",
                    self.address,
                    tries,
                    wait,
                )
            else:
                try:
                    self._join_again()
                    return
                except Exception as exc:
                    logger.warning(
                        "joining the Ray cluster at %s again failed (try %d): %s; next try in %gs",
                        self.address,
                        tries,
                        _line(exc),
                        wait,
                    )
            self._stop.wait(wait)

    def _join_again(self) -> None:
        started = time.monotonic()
        for model in self._watched():
            model.worker.release()
        try:
            serve.shutdown()
        except Exception as exc:
            logger.debug("leaving Serve on the lost cluster: %s", _line(exc))
        ray.shutdown()
        join(self.address)
        assert self._gcs is not None
        self._cluster = _cluster_id(self._gcs)
        for model in self._watched():
            handle = model.redeploy()
            model.worker.rebind(handle)
        self.lost = None
        logger.info(
            "joined the Ray cluster at %s again in %.1fs; %d model(s) serve",
            self.address,
            time.monotonic() - started,
            len(self._watched()),
        )

    def close(self) -> None:
        self._stop.set()


def _line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


_link: list[Link] = []


def open_link(address: str) -> Link:
    """Join the cluster at `address` and watch it (raises Ray's error)."""
    join(address)
    link = Link(address)
    link.start()
    _link.append(link)
    return link


def check() -> None:
    """Refuse a deployment while the cluster is lost (Ray would wait for it for ever)."""
    for link in _link:
        if link.lost is not None:
            raise RuntimeError(link.lost)


def watch(worker: Watched, redeploy: Callable[[], Any]) -> None:
    """Deploy `worker`'s model again with `redeploy` (its new handle) should the cluster be
    lost and come back."""
    for link in _link:
        link.watch(worker, redeploy)


def unwatch(worker: Watched) -> None:
    for link in _link:
        link.unwatch(worker)
