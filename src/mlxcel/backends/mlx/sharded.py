"""One rank's part of an MLX model split over a group (mx.distributed's ring backend).

Tensor parallel gives every rank a slice of every layer (mlx-lm's `model.shard`), pipeline
parallel gives each rank whole layers (`model.model.pipeline`), and either way every rank ends a
forward pass with the whole logits, so each rank runs the same `MlxGenerator` steps; rank 0
(`leader.py`) samples for real, the others (`worker/rank.py`) only follow.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx_lm.utils import load_model

from mlxcel.backends.group import ParallelMode, RankAddress, ring_hostfile
from mlxcel.backends.mlx.generator import MlxGenerator, MlxOptions


@dataclass(frozen=True)
class Split:
    """How the model is divided: the mode and, per rank, what it holds."""

    mode: str
    parts: tuple[str, ...]


def pipeline_layers(layers: int, size: int) -> list[tuple[int, int]]:
    """Each rank's [start, end) layers, as mlx-lm's PipelineMixin splits them: rank 0 the last."""
    base, extra = divmod(layers, size)
    counts = [base + (1 if r < extra else 0) for r in range(size)]
    starts = [sum(counts[r + 1 :]) for r in range(size)]
    return [(start, start + count) for start, count in zip(starts, counts, strict=True)]


def choose_mode(model: Any, mode: ParallelMode) -> str:
    """The split a model gets; ValueError when it supports neither the asked one nor any."""
    tensor = hasattr(model, "shard")
    pipeline = hasattr(getattr(model, "model", None), "pipeline")
    name = type(model).__module__.rsplit(".", 1)[-1]
    if mode == "tensor" and not tensor:
        raise ValueError(f"mlx-lm's {name} models cannot be split by tensor: use pipeline")
    if mode == "pipeline" and not pipeline:
        raise ValueError(f"mlx-lm's {name} models cannot be split by pipeline: use tensor")
    if mode == "auto":
        if not (tensor or pipeline):
            raise ValueError(f"mlx-lm's {name} models can be split neither by tensor nor pipeline")
        return "tensor" if tensor else "pipeline"
    return mode


def join_ring(ranks: tuple[RankAddress, ...], rank: int) -> mx.distributed.Group:
    """Join the ring of these ranks as `rank` (blocks until every rank has joined)."""
    with tempfile.NamedTemporaryFile("w", prefix="mlxcel-ring-", suffix=".json") as hostfile:
        hostfile.write(ring_hostfile(ranks))
        hostfile.flush()
        # The ring reads its hosts and rank from the environment (as mlx.launch sets them).
        os.environ["MLX_HOSTFILE"] = hostfile.name
        os.environ["MLX_RANK"] = str(rank)
        return mx.distributed.init(backend="ring", strict=True)


class ShardedGenerator(MlxGenerator):
    """An `MlxGenerator` whose model is this rank's part of the group's."""

    def __init__(
        self,
        path: Path,
        options: MlxOptions,
        ranks: tuple[RankAddress, ...],
        rank: int,
        mode: ParallelMode,
    ) -> None:
        self._ranks, self._rank, self._mode = ranks, rank, mode
        self.split = Split(mode, ())
        super().__init__(path, options)

    def _joining(self) -> None:
        """Called on the MLX thread before the ring is joined (rank 0 bounds it in time)."""

    def _joined(self) -> None:
        """Called on the MLX thread once the ring is up."""

    def _open_model(self, path: Path) -> tuple[Any, dict[str, Any]]:
        self._joining()
        group = join_ring(self._ranks, self._rank)
        self._joined()
        model, config = load_model(path, lazy=True)
        mode = choose_mode(model, self._mode)
        size = group.size()
        if mode == "tensor":
            model.shard(group)
            self.split = Split(mode, tuple(f"1/{size} of every layer" for _ in range(size)))
        else:
            model.model.pipeline(group)
            layers = pipeline_layers(len(model.model.layers), size)
            self.split = Split(mode, tuple(f"layers {a}-{b - 1}" for a, b in layers))
        mx.eval(model.parameters())
        # Every rank has its weights before the first step (mlx-lm's sharded_load does the same).
        mx.eval(mx.distributed.all_sum(mx.array(1.0), group=group, stream=mx.cpu))
        return model, config

    @property
    def can_save_state(self) -> bool:
        # A saved state would hold this rank's part of the KV cache only.
        return False

    def forget_slot(self, slot: int) -> None:
        """Drop a slot's KV state (after the warm-up: every slot starts out empty)."""
        self._call(self._forget, slot)
