"""One rank's part of an MLX model split over a group (mx.distributed's ring backend).

Tensor parallel gives every rank a slice of every layer (mlx-lm's `model.shard`), pipeline
parallel gives each rank whole layers (`model.model.pipeline`), and either way every rank ends a
forward pass with the whole logits, so each rank runs the same `MlxGenerator` steps; rank 0
(`leader.py`) samples for real, the others (`worker/rank.py`) only follow.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx_lm.models.pipeline import PipelineMixin
from mlx_lm.utils import _get_classes, load_config, load_model

from mlxcel.backends.group import ParallelMode, RankAddress, ring_hostfile
from mlxcel.backends.mlx.generator import MlxGenerator, MlxOptions


def _supports(model_class: type) -> tuple[bool, bool]:
    """Whether mlx-lm's model class can be split by tensor, and by pipeline."""
    module = sys.modules[model_class.__module__]
    pipelined = any(
        isinstance(c, type) and issubclass(c, PipelineMixin) and c is not PipelineMixin
        for c in vars(module).values()
    )
    return hasattr(model_class, "shard"), pipelined


def choose_mode(model_class: type, mode: ParallelMode) -> ParallelMode:
    """The split a model gets; ValueError when it supports neither the asked one nor any."""
    tensor, pipeline = _supports(model_class)
    name = model_class.__module__.rsplit(".", 1)[-1]
    if mode == "tensor" and not tensor:
        raise ValueError(f"mlx-lm's {name} models cannot be split by tensor: use pipeline")
    if mode == "pipeline" and not pipeline:
        raise ValueError(f"mlx-lm's {name} models cannot be split by pipeline: use tensor")
    if mode == "auto":
        if not (tensor or pipeline):
            raise ValueError(f"mlx-lm's {name} models can be split neither by tensor nor pipeline")
        return "tensor" if tensor else "pipeline"
    return mode


def resolve_split(path: Path, mode: ParallelMode) -> tuple[ParallelMode, int]:
    """The split a model folder gets, and its layer count, from its config alone (no weights
    are read): the server refuses a model that cannot be split before it starts."""
    config = load_config(path)
    model_class, _ = _get_classes(config)
    text = config.get("text_config", config)
    return choose_mode(model_class, mode), int(text.get("num_hidden_layers", 0))


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

    scores_prompts = False  # every rank would have to run the same forward passes

    def __init__(
        self,
        path: Path,
        options: MlxOptions,
        ranks: tuple[RankAddress, ...],
        rank: int,
        mode: ParallelMode,
    ) -> None:
        self._ranks, self._rank, self._mode = ranks, rank, mode
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
        if choose_mode(type(model), self._mode) == "tensor":
            model.shard(group)
        else:
            model.model.pipeline(group)
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
