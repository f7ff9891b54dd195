"""Ray Serve's request router for a model's replicas (`models/ray_router.py`) on its own, fed as
Ray feeds it: the prefix policy, and the loads it counts from Ray's sent and completed hooks
(Ray's queue-length cache forgets a replica after 10 s without news, and one busy with long
prompts would look idle). Served through a real cluster: test_ray.py."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from ray.serve._private.common import (
    DeploymentHandleSource,
    DeploymentID,
    RequestMetadata,
)
from ray.serve.request_router import PendingRequest, ReplicaID

from mlxcel.engine.replica_router import BLOCK_TOKENS, RouteRequest
from mlxcel.models.ray_router import PrefixReplicaRouter

DEPLOYMENT = DeploymentID(name="model", app_name="mlxcel-test")
REPLICAS = [SimpleNamespace(replica_id=ReplicaID(f"r{i}", DEPLOYMENT)) for i in range(2)]
PROMPT = list(range(8 * BLOCK_TOKENS))


def _router(imbalance: int) -> PrefixReplicaRouter:
    router = PrefixReplicaRouter(DEPLOYMENT, DeploymentHandleSource.UNKNOWN)
    router.initialize_state(slots=2, imbalance=imbalance, policy="prefix")
    return router


def _request(n: int, tokens: list[int]) -> PendingRequest:
    metadata = RequestMetadata(request_id=str(n), internal_request_id=f"internal-{n}")
    return PendingRequest(args=[], kwargs={"route": RouteRequest(tokens)}, metadata=metadata)


async def _route(router: PrefixReplicaRouter, replicas: list[Any], request: PendingRequest) -> Any:
    """The replica the router ranks first, told that Ray sent the request there."""
    first = (await router.choose_replicas(replicas, request))[0][0]
    router.on_send_request(first.replica_id)
    return first


def test_a_prefix_stays_on_its_replica_until_it_is_much_busier() -> None:
    asyncio.run(_stays_until_much_busier())


async def _stays_until_much_busier() -> None:
    """Ray builds its router, and its requests, on the handle's event loop."""
    router = _router(imbalance=2)
    replicas, prompt = REPLICAS, PROMPT
    home = await _route(router, replicas, _request(0, prompt))
    # The same prefix goes home while it is at most 2 requests busier than the other ...
    assert [await _route(router, replicas, _request(n, prompt)) for n in (1, 2)] == [home, home]
    request = _request(3, prompt)
    assert await _route(router, replicas, request) is not home
    assert request.kwargs["decision"] == "load"
    # ... and both now hold the prefix. Once every request completed, and two that failed
    # before they were sent (counting nothing), their loads are even again: the same prefix
    # goes to each in turn.
    for n in range(4):
        replica = home if n < 3 else next(r for r in replicas if r is not home)
        router.on_request_completed(replica.replica_id, f"internal-{n}")
    for n in range(2):
        router.on_request_completed(home.replica_id, f"internal-never-sent-{n}")
    again = [await _route(router, replicas, _request(n, prompt)) for n in range(4, 8)]
    assert sorted(again.count(r) for r in replicas) == [2, 2]


def test_a_dead_replicas_load_is_forgotten() -> None:
    asyncio.run(_dead_replica())


async def _dead_replica() -> None:
    router = _router(imbalance=1)
    replicas, prompt = REPLICAS, PROMPT
    home = await _route(router, replicas, _request(0, prompt))
    await _route(router, replicas, _request(1, prompt))
    router.on_replica_actor_died(home.replica_id)
    # Its requests complete later, with their errors: nothing is left of its count.
    router.on_request_completed(home.replica_id, "internal-0")
    router.on_request_completed(home.replica_id, "internal-1")
    others = [r for r in replicas if r is not home]
    assert await _route(router, others, _request(2, prompt)) is others[0]


def test_a_call_goes_to_the_least_busy_replica_first() -> None:
    asyncio.run(_a_call())


async def _a_call() -> None:
    """Calls (tokenizing, scoring a prompt, which waits for a free slot) carry no route."""
    router = _router(imbalance=4)
    replicas, prompt = REPLICAS, PROMPT
    busy = await _route(router, replicas, _request(0, prompt))
    call = PendingRequest(args=[], kwargs={}, metadata=RequestMetadata("1", "internal-1"))
    ranks = await router.choose_replicas(replicas, call)
    assert ranks == [[r] for r in sorted(replicas, key=lambda r: r is busy)]
