"""The replica router on its own: prefix matches, the load fallback, affinity, namespaces,
eviction and restarts (its use by a served model is in test_replicas.py)."""

from __future__ import annotations

import pytest

from mlxcel.engine.replica_router import (
    BLOCK_TOKENS,
    NoReplica,
    PrefixRouter,
    RouteHint,
    RouteRequest,
)

UP = [True, True, True]
IDLE = [0, 0, 0]


def prompt(seed: int, length: int = 20 * BLOCK_TOKENS) -> list[int]:
    """A prompt of distinct tokens per seed."""
    return [seed * 100_000 + i for i in range(length)]


def router(replicas: int = 3, imbalance: int = 4, capacity: int = 1 << 20) -> PrefixRouter:
    return PrefixRouter(replicas, capacity_tokens=capacity, imbalance=imbalance)


def send(r: PrefixRouter, request: RouteRequest, loads: list[int] = IDLE) -> int:
    route = r.choose(request, loads, UP[: len(loads)])
    r.sent(route.replica, request)
    return route.replica


def test_a_repeated_prefix_returns_to_its_replica() -> None:
    r = router()
    homes = {seed: send(r, RouteRequest(prompt(seed))) for seed in range(3)}
    # New prefixes spread: each replica got one.
    assert sorted(homes.values()) == [0, 1, 2]
    for seed in (2, 0, 1, 1, 0, 2):
        # The same system prompt with another question after it.
        request = RouteRequest([*prompt(seed), *range(7, 7 + seed + 40)])
        route = r.choose(request, IDLE, UP)
        assert (route.replica, route.decision) == (homes[seed], "prefix")
        assert route.matched_tokens == 20 * BLOCK_TOKENS


def test_a_match_is_counted_in_whole_blocks_from_the_start() -> None:
    r = router()
    send(r, RouteRequest(prompt(1)))
    partial = prompt(1)[: 3 * BLOCK_TOKENS + 5] + [7] * 100
    assert r.choose(RouteRequest(partial), IDLE, UP).matched_tokens == 3 * BLOCK_TOKENS
    # A prompt that shares its middle only matches nothing.
    middle = [7] * BLOCK_TOKENS + prompt(1)[BLOCK_TOKENS:]
    assert r.choose(RouteRequest(middle), IDLE, UP).decision == "least_busy"


def test_a_much_busier_holder_loses_the_request_to_the_least_busy() -> None:
    r = router(imbalance=2)
    home = send(r, RouteRequest(prompt(5)))
    loads = [0, 0, 0]
    loads[home] = 2
    assert r.choose(RouteRequest(prompt(5)), loads, UP).decision == "prefix"
    loads[home] = 3
    route = r.choose(RouteRequest(prompt(5)), loads, UP)
    assert route.decision == "load" and route.replica != home


def test_nothing_cached_goes_to_the_least_busy() -> None:
    r = router()
    route = r.choose(RouteRequest(prompt(9)), [3, 1, 2], UP)
    assert (route.replica, route.decision) == (1, "least_busy")


def test_a_conversation_key_keeps_its_replica_over_a_longer_prefix_elsewhere() -> None:
    r = router()
    chat = RouteHint(affinity="conversation-1")
    first = send(r, RouteRequest(prompt(1), chat))
    other = send(r, RouteRequest(prompt(2)))
    assert other != first
    # Its next turn matches replica `other`'s prefix, but the conversation stays.
    route = r.choose(RouteRequest(prompt(2), chat), IDLE, UP)
    assert (route.replica, route.decision) == (first, "affinity")


def test_namespaces_never_share_a_prefix() -> None:
    r = router()
    home = send(r, RouteRequest(prompt(3), RouteHint(namespace="adapter-a")))
    route = r.choose(RouteRequest(prompt(3), RouteHint(namespace="adapter-b")), IDLE, UP)
    assert route.decision == "least_busy"
    same = r.choose(RouteRequest(prompt(3), RouteHint(namespace="adapter-a")), IDLE, UP)
    assert (same.replica, same.decision) == (home, "prefix")


def test_the_least_recently_sent_prefix_is_evicted_first() -> None:
    # Room for two prompts of 20 blocks on the one replica.
    r = router(replicas=1, capacity=40 * BLOCK_TOKENS)
    for seed in (1, 2, 1, 3):
        send(r, RouteRequest(prompt(seed)), [0])
    assert r.cached_prefixes(0) == 40
    assert r.choose(RouteRequest(prompt(1)), [0], [True]).matched_tokens == 20 * BLOCK_TOKENS
    assert r.choose(RouteRequest(prompt(3)), [0], [True]).matched_tokens == 20 * BLOCK_TOKENS
    assert r.choose(RouteRequest(prompt(2)), [0], [True]).matched_tokens == 0


def test_a_partly_evicted_prompt_keeps_its_start() -> None:
    # The shorter prefixes are the most recent blocks of a prompt, so they go last.
    r = router(replicas=1, capacity=30 * BLOCK_TOKENS)
    send(r, RouteRequest(prompt(1)), [0])
    send(r, RouteRequest(prompt(2)), [0])
    assert r.choose(RouteRequest(prompt(1)), [0], [True]).matched_tokens == 10 * BLOCK_TOKENS


def test_a_restarted_replica_holds_nothing_and_loses_its_conversations() -> None:
    r = router()
    chat = RouteHint(affinity="c")
    home = send(r, RouteRequest(prompt(4), chat))
    r.forget(home)
    assert r.cached_prefixes(home) == 0
    assert r.choose(RouteRequest(prompt(4), chat), IDLE, UP).decision == "least_busy"


def test_replicas_not_serving_are_skipped() -> None:
    r = router()
    home = send(r, RouteRequest(prompt(6)))
    serving = [True, True, True]
    serving[home] = False
    route = r.choose(RouteRequest(prompt(6)), IDLE, serving)
    assert route.replica != home
    with pytest.raises(NoReplica):
        r.choose(RouteRequest(prompt(6)), IDLE, [False, False, False])


def test_round_robin_takes_turns_whatever_is_cached() -> None:
    r = PrefixRouter(2, capacity_tokens=1 << 20, imbalance=4, policy="round-robin")
    chosen = [send(r, RouteRequest(prompt(1)), [0, 0]) for _ in range(4)]
    assert sorted(chosen) == [0, 0, 1, 1] and chosen[0] != chosen[1]
    assert r.choose(RouteRequest(prompt(1)), [0, 0], [True, True]).decision == "round_robin"


def test_power_of_two_takes_the_less_busy_of_two_drawn_whatever_is_cached() -> None:
    r = PrefixRouter(3, capacity_tokens=1 << 20, imbalance=4, policy="power-of-two")
    chosen = set()
    for _ in range(60):
        route = r.choose(RouteRequest(prompt(1)), [0, 5, 9], [True, True, True])
        assert route.decision == "power_of_two"
        # Replica 2 is the busiest: drawn with either other, it loses.
        assert route.replica != 2
        chosen.add(route.replica)
        r.sent(route.replica, RouteRequest(prompt(1)))
    assert chosen == {0, 1}
    assert r.choose(RouteRequest(prompt(1)), [0, 0, 0], [False, False, True]).replica == 2
