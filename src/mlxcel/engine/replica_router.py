"""Which replica of a model a request goes to: the one whose cache holds the longest prefix of
its prompt, unless that one is much busier than the least busy.

The router models each replica's cache from what it was sent, as a least-recently-used set of
token blocks: block i of a prompt is named by a hash chained over blocks 0..i, so a name stands
for a whole prefix, and a prompt's match is the blocks found in order from its start. It knows
nothing of HTTP, engines or processes: the local replica set (`models/replicas.py`) asks it
with the replicas' loads and reports what it sent, and any other placement can do the same.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from mlxcel.engine.types import EngineError

# Tokens per block. A prompt's match is counted in whole blocks: finer blocks find a shared
# prefix to within a few tokens (a chat's system prompt rarely ends on a round number), and the
# cost is one hash of 16 ints per block, about 100 for a 1,500-token prompt, microseconds.
BLOCK_TOKENS = 16
# Conversations (prompt_cache_key or user) remembered, least recently used out first.
AFFINITY_KEYS = 4096
# power-of-two: the less busy of two replicas drawn at random (Ray Serve's default; on Ray,
# Ray's own router), for comparison.
POLICIES = ("prefix", "round-robin", "power-of-two")
Policy = Literal["prefix", "round-robin", "power-of-two"]
Decision = Literal["prefix", "load", "affinity", "least_busy", "round_robin", "power_of_two"]
DECISIONS: tuple[Decision, ...] = (
    "prefix",
    "load",
    "affinity",
    "least_busy",
    "round_robin",
    "power_of_two",
)


def check_room(queue_size: int, slots_each: int, serving: int, in_flight: int, count: int) -> None:
    """The model's admission across its replicas, local or on Ray: `count` more sequences fit
    while those in flight leave room in the serving replicas' slots and the model's queue;
    raises EngineError `server_busy` when not (with none serving, the caller says why)."""
    if serving and count > queue_size + slots_each * serving - in_flight:
        raise EngineError("the server is busy: request queue is full", "server_busy")


class NoReplica(Exception):
    """No replica serves right now."""


@dataclass(frozen=True)
class RouteHint:
    """What a request says about where it should go, beside its prompt."""

    affinity: str | None = None
    """A conversation's key: OpenAI's `prompt_cache_key`, else `user`."""
    namespace: str = ""
    """Whatever else decides what a cached prefix holds (a LoRA adapter set): prefixes of
    different namespaces never match."""


NO_HINT = RouteHint()


@dataclass(frozen=True)
class RouteRequest:
    """What routing reads of a request."""

    tokens: Sequence[int]
    """The rendered prompt's tokens (empty for a prompt the worker lays out, with media)."""
    hint: RouteHint = NO_HINT


@dataclass(frozen=True)
class Route:
    """Where a request goes, why, and how much of its prompt the replica is believed to hold."""

    replica: int
    decision: Decision
    matched_tokens: int = 0


def block_names(request: RouteRequest) -> list[int]:
    """The chained hash of each whole block of the prompt, first block first."""
    tokens = request.tokens
    names = []
    previous = hash(request.hint.namespace)
    for start in range(0, len(tokens) - BLOCK_TOKENS + 1, BLOCK_TOKENS):
        previous = hash((previous, tuple(tokens[start : start + BLOCK_TOKENS])))
        names.append(previous)
    return names


class ReplicaCache:
    """One replica's cache as the router believes it: prefix blocks, least recent first."""

    def __init__(self, capacity_blocks: int) -> None:
        self.capacity = max(1, capacity_blocks)
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._blocks)

    def matched(self, names: Sequence[int]) -> int:
        """Blocks of a prompt held, counted from its start."""
        for count, name in enumerate(names):
            if name not in self._blocks:
                return count
        return len(names)

    def add(self, names: Sequence[int]) -> None:
        """A prompt was sent: its blocks are the most recent. The longest prefix is touched
        first, so its shorter prefixes, which every longer match walks through, go last."""
        for name in reversed(names):
            self._blocks[name] = None
            self._blocks.move_to_end(name)
        while len(self._blocks) > self.capacity:
            self._blocks.popitem(last=False)

    def clear(self) -> None:
        """The replica restarted: it holds nothing."""
        self._blocks.clear()


class PrefixRouter:
    """Routes requests across `replicas` replicas (numbered from 0).

    `imbalance`: how many more requests (running or queued) the replica with the longest
    prefix may have than the least busy before a request goes to the least busy instead.
    `capacity_tokens`: what one replica's cache is believed to hold.
    """

    def __init__(
        self,
        replicas: int,
        *,
        capacity_tokens: int,
        imbalance: int,
        policy: Policy = "prefix",
    ) -> None:
        self.policy: Policy = policy
        self.imbalance = imbalance
        self._caches = [ReplicaCache(capacity_tokens // BLOCK_TOKENS) for _ in range(replicas)]
        self._affinity: OrderedDict[str, int] = OrderedDict()
        self._turn = 0
        self._draw = random.Random(0)

    def choose(self, request: RouteRequest, loads: Sequence[int], serving: Sequence[bool]) -> Route:
        """The replica for a request, given each replica's requests in flight and whether it
        serves; NoReplica when none does. Nothing is recorded: call `sent` once it is sent."""
        ready = [i for i, up in enumerate(serving) if up]
        if not ready:
            raise NoReplica("no replica of the model is serving")
        if self.policy == "round-robin":
            self._turn += 1
            return Route(ready[self._turn % len(ready)], "round_robin")
        if self.policy == "power-of-two":
            pair = self._draw.sample(ready, min(2, len(ready)))
            return Route(min(pair, key=lambda i: loads[i]), "power_of_two")
        names = block_names(request)
        matched = {i: self._caches[i].matched(names) for i in ready}
        least = min(loads[i] for i in ready)
        key = request.hint.affinity
        if key is not None and self._affinity.get(key) in ready:
            held = self._affinity[key]
            return Route(held, "affinity", matched[held] * BLOCK_TOKENS)
        best = max(ready, key=lambda i: (matched[i], -loads[i]))
        if matched[best] == 0:
            # Nothing cached anywhere: the least busy, then the emptiest cache (a new prefix
            # spreads), taking turns among equals.
            self._turn += 1
            rank = {i: (loads[i], len(self._caches[i])) for i in ready}
            lowest = min(rank.values())
            equal = [i for i in ready if rank[i] == lowest]
            return Route(equal[self._turn % len(equal)], "least_busy")
        if loads[best] - least > self.imbalance:
            idle = [i for i in ready if loads[i] == least]
            spare = max(idle, key=lambda i: matched[i])
            return Route(spare, "load", matched[spare] * BLOCK_TOKENS)
        return Route(best, "prefix", matched[best] * BLOCK_TOKENS)

    def sent(self, replica: int, request: RouteRequest) -> None:
        """The request went to `replica`: its prompt is now in that replica's cache, and its
        conversation stays there."""
        self._caches[replica].add(block_names(request))
        key = request.hint.affinity
        if key is not None:
            self._affinity[key] = replica
            self._affinity.move_to_end(key)
            while len(self._affinity) > AFFINITY_KEYS:
                self._affinity.popitem(last=False)

    def forget(self, replica: int) -> None:
        """The replica restarted with an empty cache; its conversations go elsewhere."""
        self._caches[replica].clear()
        for key in [k for k, held in self._affinity.items() if held == replica]:
            del self._affinity[key]

    def cached_prefixes(self, replica: int) -> int:
        """Prefixes (blocks, each naming the prompt up to its end) a replica is believed to
        hold."""
        return len(self._caches[replica])
