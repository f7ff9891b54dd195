"""The Ray settings of a config file: the `ray:` section (the cluster's address) and a model's
`autoscaling` and `ray_actor_options` (docs/replicas.md, Replicas on a Ray cluster)."""

from __future__ import annotations

from typing import Any

AUTOSCALING_KEYS = ("min_replicas", "max_replicas", "target_ongoing_requests")
ACTOR_OPTION_KEYS = ("num_cpus", "num_gpus", "resources")


def _mapping(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"{what} must be a mapping")
    return value


def autoscaling(value: Any) -> dict[str, float]:
    """`autoscaling: {min_replicas, max_replicas, target_ongoing_requests}`, as Ray names
    them: at least one replica, at most 64, min <= max."""
    given = _mapping(value, "autoscaling")
    unknown = sorted(set(given) - set(AUTOSCALING_KEYS))
    if unknown:
        raise ValueError(f"unknown key '{unknown[0]}' (it has {', '.join(AUTOSCALING_KEYS)})")
    out: dict[str, float] = {}
    for key, item in given.items():
        if isinstance(item, bool) or not isinstance(item, int | float) or item <= 0:
            raise ValueError(f"{key} must be a positive number")
        out[key] = int(item) if key != "target_ongoing_requests" else float(item)
    low, high = out.setdefault("min_replicas", 1), out.setdefault("max_replicas", 1)
    if not 1 <= low <= high <= 64:
        raise ValueError("it needs 1 <= min_replicas <= max_replicas <= 64")
    return out


def actor_options(value: Any) -> dict[str, Any]:
    """`ray_actor_options: {num_cpus, num_gpus, resources: {NAME: amount}}`."""
    given = _mapping(value, "ray_actor_options")
    unknown = sorted(set(given) - set(ACTOR_OPTION_KEYS))
    if unknown:
        raise ValueError(f"unknown key '{unknown[0]}' (it has {', '.join(ACTOR_OPTION_KEYS)})")
    for key in ("num_cpus", "num_gpus"):
        item = given.get(key, 0)
        if isinstance(item, bool) or not isinstance(item, int | float) or item < 0:
            raise ValueError(f"{key} must be a number, at least 0")
    resources = _mapping(given.get("resources", {}), "resources")
    if any(not isinstance(v, int | float) or isinstance(v, bool) for v in resources.values()):
        raise ValueError("each of resources must be a number")
    return dict(given)


def section(value: Any) -> dict[str, Any]:
    """The `ray:` section: `{address: ADDRESS, start_timeout: SECONDS}` (or `auto`), or the
    address alone; the server settings it gives."""
    settings: dict[str, Any] = {}
    if isinstance(value, dict):
        unknown = sorted(set(value) - {"address", "start_timeout"})
        if unknown or "address" not in value:
            raise ValueError(
                "the ray section has the keys address (host:port, or auto) and start_timeout"
            )
        timeout = value.get("start_timeout", 0)
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout < 0:
            raise ValueError("start_timeout must be a number of seconds, at least 0")
        if "start_timeout" in value:
            settings["ray_start_timeout"] = float(timeout)
        value = value["address"]
    if not isinstance(value, str) or not value.strip():
        raise ValueError("ray's address must be host:port or auto")
    settings["ray_address"] = value.strip()
    return settings
