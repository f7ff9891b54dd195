"""Where a model's replicas run: on this machine, or on the Ray cluster of
`mlxcel serve --ray ADDRESS`, whose connection is made at start, before any model loads, and
said in one line when it cannot be; then watched, and made again should the cluster be lost
and come back (`models/ray_link.py`).

Ray is imported here only when `--ray` is given: the server without it never imports Ray.
Ray's usage stats are off unless the environment turns them on; its dashboard is the
cluster's (`ray start --include-dashboard=false`, docs/replicas.md).
"""

from __future__ import annotations

import asyncio
import os
import socket

from mlxcel.config.settings import ModelConfig
from mlxcel.engine.metrics import EngineMetrics
from mlxcel.models.loaded import LoadedModel, served_model
from mlxcel.models.replicas import start_replicas
from mlxcel.wire.messages import Setup

INSTALL = "pip install 'mlxcel[ray]'"

# Seconds the cluster's port has to answer at start.
PROBE_S = 5.0
# The default of `ray: {start_timeout}` (--ray-start-timeout).
DEFAULT_START_TIMEOUT = 300.0
_connected: list[tuple[str, float]] = []


class RayUnreachable(Exception):
    """Ray is not installed, or the cluster cannot be reached (a one-line reason)."""


def connect(address: str, start_timeout: float = DEFAULT_START_TIMEOUT) -> None:
    """Join the cluster at `address` (host:port of its GCS, or auto) as a driver and start
    Ray Serve there without its HTTP proxy (this server is the ingress), then watch it
    (`models/ray_link.py`); a model's replicas must serve within `start_timeout` seconds."""
    if address.startswith("ray://"):
        # Joined through Ray Client, every streamed request would fail with Serve's "Streaming
        # DeploymentHandles are not currently supported ... using Ray Client" (tried here).
        raise RayUnreachable(
            f"{address} is a Ray Client address, over which Ray Serve cannot stream: give "
            "the cluster's GCS address (head:6379), from a machine on the cluster's network"
        )
    _reachable(address)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # Ray ends a driver that cannot reach the cluster for a minute; this server stays up
    # (its requests to the lost cluster get 503).
    os.environ.setdefault("RAY_gcs_rpc_server_reconnect_timeout_s", str(365 * 86400))
    os.environ.setdefault("RAY_SERVE_LOG_TO_STDERR", "0")
    # Never a local cluster of its own: after the cluster is lost (`ray.shutdown`), a call
    # left over from it would otherwise start one (and write ~/.ray/auth_token).
    os.environ["RAY_ENABLE_AUTO_CONNECT"] = "0"
    try:
        import ray

        from mlxcel.models.ray_link import open_link
    except ImportError:
        raise RayUnreachable(f"--ray needs Ray Serve: {INSTALL}") from None
    try:
        open_link(address)
    except Exception as exc:
        ray.shutdown()
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise RayUnreachable(f"the Ray cluster at {address} cannot be reached: {first}") from None
    _connected.append((address, start_timeout))


def _reachable(address: str) -> None:
    """Refuse at once a cluster whose port does not answer (Ray's own client would wait for
    it for minutes)."""
    if address == "auto":
        return
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host.strip("[]") or "127.0.0.1", int(port)), PROBE_S).close()
    except (OSError, ValueError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise RayUnreachable(f"the Ray cluster at {address} cannot be reached: {why}") from None


def connected() -> bool:
    """Whether this server serves replicated models on a Ray cluster."""
    return bool(_connected)


def on_ray(config: ModelConfig, kind: str) -> bool:
    """Whether the model's replicas are placed on the Ray cluster (outside this host's
    --max-memory: their memory is on the cluster's nodes)."""
    return bool(_connected) and kind == "text" and (config.replicas > 1 or bool(config.autoscaling))


def replicated_model(
    config: ModelConfig,
    kind: str,
    setup: Setup,
    metrics: EngineMetrics,
    loop: asyncio.AbstractEventLoop,
    heartbeat_timeout: float,
) -> LoadedModel | None:
    """A text model with replicas, once they serve (a thread): on the cluster with `--ray`
    (there `autoscaling` too), else on this machine; None for a model of one worker."""
    if on_ray(config, kind):
        from mlxcel.models.ray_worker import ray_model

        return ray_model(config, setup, metrics, _connected[0][1])
    if kind != "text" or config.replicas <= 1:
        return None
    replicas, facts = start_replicas(config, setup, metrics, loop, heartbeat_timeout)
    return served_model(replicas.config, replicas, facts)
