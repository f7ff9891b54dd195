"""Deploying a model's replicas on the Ray cluster as a Ray Serve application, within a
deadline: a replica that no node can take (`ray_actor_options` asking for more than any node
has) would otherwise keep the model `loading` for ever.

Imported only with `--ray` (`models/ray_worker.py`, `models/ray_link.py`).
"""

from __future__ import annotations

import re
import time
from dataclasses import replace
from typing import Any

import ray
from ray import serve
from ray.serve.config import RequestRouterConfig

from mlxcel.config.cores import default_threads
from mlxcel.config.settings import ModelConfig
from mlxcel.models.ray_replica import ModelReplica
from mlxcel.models.ray_router import PrefixReplicaRouter
from mlxcel.models.replicas import replica_threads
from mlxcel.wire.facts import TextFacts
from mlxcel.wire.messages import Setup

# Health checks every 2 s: a replica whose worker died is replaced within seconds.
HEALTH_CHECK_S = 2.0
# Ray queues no request in the handle: each replica's worker has the model's queue.
MAX_ONGOING = 10_000
# How often the application's state is read while it deploys.
POLL_S = 0.5
# Ray's names for the resources `ray_actor_options` asks for.
_RESOURCE_NAMES = {"num_cpus": "CPU", "num_gpus": "GPU"}


class DeployFailed(Exception):
    """The model's replicas did not serve: Ray's reason, or the deadline's (one line)."""


def app_name(config: ModelConfig) -> str:
    """The model's Ray Serve application."""
    return "mlxcel-" + re.sub(r"[^A-Za-z0-9_.-]", "-", config.served_name)


def replica_setup(config: ModelConfig, setup: Setup) -> Setup:
    """Each replica's worker setup: its threads as `--threads` says, else its `num_cpus`,
    else the usable cores divided among the replicas (with `autoscaling`: all of them)."""
    cpus = config.ray_actor_options.get("num_cpus")
    if config.threads == default_threads() and cpus:
        config = replace(config, threads=max(1, int(cpus)))
    elif not config.autoscaling:
        config = replace(config, threads=replica_threads(config))
    return replace(setup, config=config)


def deploy(config: ModelConfig, setup: Setup, timeout: float) -> tuple[Any, TextFacts]:
    """Deploy the model's application and wait until it serves, at most `timeout` seconds
    (0: no deadline); its handle and the model's facts. Past the deadline the application is
    deleted and `DeployFailed` names what its replicas ask for and what the nodes have."""
    options = dict(config.ray_actor_options)
    most = int(config.autoscaling.get("max_replicas", config.replicas))
    # power-of-two: Ray Serve's own default router (for comparison: bench/replicas_ray.py).
    router = (
        {}
        if config.replica_routing == "power-of-two"
        else {
            "request_router_config": RequestRouterConfig(
                request_router_class=PrefixReplicaRouter,  # type: ignore[arg-type]
                request_router_kwargs={
                    "slots": 2 * most,
                    "imbalance": config.replica_imbalance,
                    "policy": config.replica_routing,
                },
            )
        }
    )
    scaling: dict[str, Any] = (
        {"autoscaling_config": dict(config.autoscaling)}
        if config.autoscaling
        else {"num_replicas": config.replicas}
    )
    deployment = serve.deployment(ModelReplica).options(  # type: ignore[attr-defined]
        name="model",
        ray_actor_options=options or None,
        max_ongoing_requests=MAX_ONGOING,
        health_check_period_s=HEALTH_CHECK_S,
        **router,
        **scaling,
    )
    app = app_name(config)
    handle = serve._run(deployment.bind(setup), name=app, route_prefix=None, _blocking=False)
    _wait_running(config, app, timeout)
    facts: TextFacts = handle.options(method_name="facts").remote().result()
    return handle, facts


def _wait_running(config: ModelConfig, app: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout if timeout > 0 else float("inf")
    while True:
        status = serve.status().applications.get(app)
        state = str(status.status.value) if status is not None else "NOT_STARTED"
        if state == "RUNNING":
            return
        if state in ("DEPLOY_FAILED", "UNHEALTHY"):
            assert status is not None
            words = _said(status)
            serve.delete(app, _blocking=False)
            raise DeployFailed(f"Ray could not start its replicas: {words}")
        if time.monotonic() >= deadline:
            serve.delete(app, _blocking=False)
            said = _said(status) if status is not None else ""
            raise DeployFailed(_late(config, timeout, said))
        time.sleep(POLL_S)


def _said(status: Any) -> str:
    """The application's message, else its deployment's (one line each)."""
    messages = [status.message, *(d.message for d in status.deployments.values())]
    lines = [m.strip().splitlines()[0] for m in messages if m and m.strip()]
    return lines[0] if lines else str(status.status.value)


def asked(options: dict[str, Any]) -> dict[str, float]:
    """What one replica asks of a node, in Ray's resource names (Serve's default: 1 CPU)."""
    wanted = {"CPU": 1.0} if "num_cpus" not in options else {}
    for key, value in options.items():
        if key in _RESOURCE_NAMES:
            wanted[_RESOURCE_NAMES[key]] = float(value)
        elif key == "resources":
            wanted.update({str(k): float(v) for k, v in value.items()})
    return {k: v for k, v in wanted.items() if v > 0}


def nodes() -> list[tuple[str, dict[str, float]]]:
    """Each live node's address and its resources (without Ray's per-node labels)."""
    found = []
    for node in ray.nodes():
        if node.get("Alive"):
            have = {
                str(k): float(v)
                for k, v in node.get("Resources", {}).items()
                if not k.startswith("node:") and k not in ("memory", "object_store_memory")
            }
            found.append((str(node.get("NodeManagerAddress", "?")), have))
    return found


def _amounts(resources: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:g}" for k, v in sorted(resources.items())) or "nothing"


def _late(config: ModelConfig, timeout: float, said: str) -> str:
    """Why the replicas do not serve after the deadline: no node has what each asks for, or
    Ray's own words."""
    wanted = asked(dict(config.ray_actor_options))
    have = nodes()
    fits = [a for a, r in have if all(r.get(k, 0.0) >= v for k, v in wanted.items())]
    head = f"its replicas did not serve on the Ray cluster within {timeout:g}s (ray.start_timeout)"
    if not fits:
        listed = "; ".join(f"{a}: {_amounts(r)}" for a, r in have) or "none"
        return (
            f"{head}: each replica asks for {_amounts(wanted)} and no node has that "
            f"(the nodes have {listed})"
        )
    return f"{head}: {said}" if said else head
