"""The replica flags of `-m`'s model: how many worker processes serve it, and how a request
picks one (docs/replicas.md; a config file sets them per model)."""

from __future__ import annotations

import argparse
from typing import Any

from mlxcel.config import settings as defaults
from mlxcel.engine.replica_router import POLICIES


def replica_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the replica flags."""
    group = parser.add_argument_group("replicas")
    add = group.add_argument
    add(
        "--replicas",
        type=int,
        default=1,
        help="worker processes serving the model, each with its own engine and caches; "
        "--threads left at its default divides the usable cores among them "
        "(default: %(default)s)",
    )
    add(
        "--replica-routing",
        choices=POLICIES,
        default="prefix",
        help="how a request picks a replica: prefix sends it to the one whose cache holds "
        "the longest prefix of its prompt (default: %(default)s)",
    )
    add(
        "--replica-imbalance",
        type=int,
        default=defaults.DEFAULT_REPLICA_IMBALANCE,
        help="requests the replica with the prefix may have beyond the least busy one before "
        "a request goes to the least busy (default: %(default)s)",
    )
    add(
        "--ray",
        dest="ray_address",
        metavar="ADDRESS",
        default=None,
        help="serve each model with replicas (or autoscaling) as a Ray Serve deployment on the "
        "Ray cluster at ADDRESS (host:port, or auto); needs mlxcel[ray] (docs/replicas.md)",
    )
    add(
        "--ray-start-timeout",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="seconds a model's replicas on Ray have to serve (placed and loaded) before the "
        "model fails, 0: no limit (default: %(default)s)",
    )


def check_replica_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse replica flags out of range."""
    if not 1 <= args.replicas <= 64:
        parser.error("--replicas must be between 1 and 64")
    if args.replica_imbalance < 0:
        parser.error("--replica-imbalance must be at least 0")
    if args.ray_start_timeout < 0:
        parser.error("--ray-start-timeout must be at least 0")


def replica_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The ModelConfig fields these flags set."""
    return {
        "replicas": args.replicas,
        "replica_routing": args.replica_routing,
        "replica_imbalance": args.replica_imbalance,
    }
