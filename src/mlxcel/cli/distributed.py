"""The flags that split one MLX model over machines (`--distributed`), and what a rank past 0
runs instead of the server."""

from __future__ import annotations

import argparse
import os
from dataclasses import replace
from pathlib import Path

from mlxcel.backends.group import (
    DEFAULT_RANK_TIMEOUT_S,
    PARALLEL_MODES,
    DistributedConfig,
    RankAddress,
    read_hostfile,
)
from mlxcel.cli.models import fail
from mlxcel.config.engines import choose_backend
from mlxcel.config.settings import ModelConfig


def distributed_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the group flags."""
    group = parser.add_argument_group("one model over several machines (MLX)")
    group.add_argument(
        "--distributed",
        type=Path,
        metavar="HOSTFILE",
        help="split -m's MLX model over the ranks this hostfile lists (mlx.launch's format, or "
        "the ring's); under mlx.launch, its $MLX_HOSTFILE (see docs/distributed.md)",
    )
    group.add_argument(
        "--rank",
        type=int,
        metavar="N",
        help="this machine's rank in the hostfile: 0 serves HTTP, the others only hold their "
        "part of the model (default: $MLX_RANK, as mlx.launch sets it, else 0)",
    )
    group.add_argument(
        "--parallel-mode",
        choices=PARALLEL_MODES,
        default="auto",
        help="tensor (every rank a slice of each layer) or pipeline (each rank whole layers); "
        "auto: tensor where the model can (default: %(default)s)",
    )
    group.add_argument(
        "--rank-timeout",
        type=float,
        default=DEFAULT_RANK_TIMEOUT_S,
        metavar="S",
        help="how long rank 0 waits on another rank to connect, join or finish a step before "
        "the model fails with 503 model_unavailable naming it (default: %(default)g)",
    )


def _hostfile(args: argparse.Namespace) -> Path | None:
    if args.distributed is not None:
        return Path(args.distributed)
    # mlx.launch gives every rank the ring's hostfile (empty for one host) and its rank.
    launched = os.environ.get("MLX_HOSTFILE") if "MLX_RANK" in os.environ else None
    return Path(launched) if launched and Path(launched).stat().st_size > 2 else None


def distributed_config(
    parser: argparse.ArgumentParser, args: argparse.Namespace
) -> tuple[DistributedConfig | None, int]:
    """The group -m's model runs over (None: this machine alone), and this machine's rank."""
    try:
        hostfile = _hostfile(args)
        if hostfile is None:
            return None, 0
        ranks = read_hostfile(hostfile)
    except (OSError, ValueError) as exc:
        parser.error(str(exc))
    rank = args.rank if args.rank is not None else int(os.environ.get("MLX_RANK", "0"))
    if not 0 <= rank < len(ranks):
        parser.error(f"--rank {rank}: the hostfile lists ranks 0 to {len(ranks) - 1}")
    if not args.rank_timeout > 0:
        parser.error("--rank-timeout must be more than 0")
    config = DistributedConfig(hostfile, args.parallel_mode, args.rank_timeout, addresses=ranks)
    return config, rank


def with_split(parser: argparse.ArgumentParser, model: ModelConfig) -> ModelConfig:
    """The model with its group's split decided (auto resolved, the layers counted); a model
    mlx-lm cannot split the way asked, or not an MLX text model, stops the start."""
    group = model.distributed
    if group is None:
        return model
    try:
        if model.kind != "text" or choose_backend(model.model, model.backend) != "mlx":
            raise ValueError("--distributed serves MLX text models (a folder mlx-lm loads)")
        from mlxcel.backends.mlx.sharded import resolve_split

        mode, layers = resolve_split(model.model, group.mode)
        ranks = group.ranks()
    except (OSError, ValueError, KeyError, ImportError) as exc:
        fail(parser, f"{model.model}: {exc}")
    return replace(model, distributed=replace(group, mode=mode, layers=layers, addresses=ranks))


def serve_other_rank(config: DistributedConfig, rank: int) -> int:
    """Run rank `rank` (past 0): no HTTP, its part of the model for rank 0's sessions."""
    from mlxcel.worker.rank import serve_rank

    ranks: tuple[RankAddress, ...] = config.ranks()
    return serve_rank(ranks, rank)
