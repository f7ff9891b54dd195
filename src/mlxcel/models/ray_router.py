"""Ray Serve's request router for a model's replicas on a Ray cluster, with the prefix policy of
local replicas (`engine/replica_router.PrefixRouter`), not Ray's default power of two choices,
which knows nothing of a replica's cache.

Ray runs it in the process that holds the deployment handle (the HTTP process), on the
handle's event loop. Each stream request carries its `RouteRequest` and what a replica's cache
holds (`route` and `capacity`; the router adds its `decision`, which the replica says back);
calls carry neither and go to the least busy replica first. Ray's replica ids are numbered
for the router as they appear; a replica that dies frees its number and its believed cache.

A replica's load is the requests Ray sent it that have not completed (Ray's `on_send_request`
and `on_request_completed`, which come in that order, a refused request's too), not Ray's
queue-length cache: that forgets a replica after 10 s without news, and a replica busy with
long prompts then looks idle.
"""

from __future__ import annotations

from typing import Any

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

from mlxcel.engine.replica_router import NoReplica, Policy, PrefixRouter, RouteRequest


class PrefixReplicaRouter(RequestRouter):
    """Each request to the replica whose cache holds the longest prefix of its prompt, unless
    it is much busier than the least busy (Ray's queue lengths are the loads)."""

    def initialize_state(self, **kwargs: Any) -> None:
        """`slots`: replicas the router numbers at most at once; `imbalance`, `policy`: as
        for local replicas."""
        self._slots = int(kwargs.get("slots", 2))
        self._imbalance = int(kwargs.get("imbalance", 4))
        self._policy: Policy = "round-robin" if kwargs.get("policy") == "round-robin" else "prefix"
        self._router: PrefixRouter | None = None
        self._numbers: dict[ReplicaID, int] = {}
        self._ongoing: dict[ReplicaID, int] = {}

    def _number(self, replica_id: ReplicaID) -> int | None:
        number = self._numbers.get(replica_id)
        if number is None:
            free = sorted(set(range(self._slots)) - set(self._numbers.values()))
            if not free:
                return None
            number = self._numbers[replica_id] = free[0]
        return number

    def _prefix_router(self, capacity: int) -> PrefixRouter:
        if self._router is None:
            self._router = PrefixRouter(
                self._slots,
                capacity_tokens=capacity,
                imbalance=self._imbalance,
                policy=self._policy,
            )
        return self._router

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        """The replica the prefix policy picks first, then the others."""
        route = pending_request.kwargs.get("route") if pending_request is not None else None
        if not isinstance(route, RouteRequest) or pending_request is None:
            # A call (tokenizing, scoring a prompt, which waits for a free slot): the least
            # busy first.
            by_load = sorted(candidate_replicas, key=lambda r: self._ongoing.get(r.replica_id, 0))
            return [[replica] for replica in by_load]
        router = self._prefix_router(int(pending_request.kwargs.get("capacity", 1 << 20)))
        numbered = {self._number(r.replica_id): r for r in candidate_replicas}
        numbered.pop(None, None)
        loads = [0] * self._slots
        serving = [False] * self._slots
        for number, replica in numbered.items():
            assert number is not None
            loads[number] = self._ongoing.get(replica.replica_id, 0)
            serving[number] = True
        try:
            chosen = router.choose(route, loads, serving)
        except NoReplica:
            return [candidate_replicas]
        first = numbered[chosen.replica]
        # Recorded as sent now: a replica takes every request it is given (its worker queues
        # or refuses it), so Ray sends it to the first rank.
        router.sent(chosen.replica, route)
        # The replica says it back with its first item (the HTTP process counts decisions).
        pending_request.kwargs["decision"] = chosen.decision
        return [[first], [r for r in candidate_replicas if r is not first]]

    def on_send_request(self, replica_id: ReplicaID) -> None:
        """A request went to a replica: one more of its load until it completes."""
        super().on_send_request(replica_id)
        self._ongoing[replica_id] = self._ongoing.get(replica_id, 0) + 1

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        """A request ended, answered, refused or failed."""
        super().on_request_completed(replica_id, internal_request_id)
        if self._ongoing.get(replica_id, 0) > 0:
            self._ongoing[replica_id] -= 1

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        """A replica ended: its number and its believed cache are free."""
        super().on_replica_actor_died(replica_id)
        self._ongoing.pop(replica_id, None)
        number = self._numbers.pop(replica_id, None)
        if number is not None and self._router is not None:
            self._router.forget(number)
