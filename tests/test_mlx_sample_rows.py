"""MLX's sampling of one decode step's rows (`backends/mlx/sampling.sample_rows`): rows whose
chains are the same are picked together, and each picks what its own sampler picks alone and
what the sampler chain picks for a row that asks for logprobs."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("mlx")

import mlx.core as mx

from mlxcel.backends.mlx.sampling import SlotSampler, sample_rows
from mlxcel.engine.types import SamplingParams

VOCAB = 512
ENDS = [0, 1]
STEPS = 24

KINDS: list[dict[str, Any]] = [
    {"temperature": 0},
    {"temperature": 0, "ignore_eos": True},
    {"temperature": 0.8, "seed": 1},
    {"temperature": 0.8, "seed": 2},
    {"temperature": 1.0, "top_k": 0, "top_p": 1, "min_p": 0, "seed": 3},
    {"temperature": 0.7, "top_p": 0.5, "typical_p": 0.9, "seed": 4, "ignore_eos": True},
    {"temperature": 0.9, "p_less": True, "seed": 5},
    {"temperature": 0.8, "min_tokens": 10, "seed": 6},
]


def sampler(**params: Any) -> SlotSampler:
    chain = {"top_k": 40, "top_p": 0.95, "min_p": 0.05, **params}
    return SlotSampler(
        SamplingParams(max_tokens=STEPS, **chain),
        n_vocab=VOCAB,
        end_of_generation=ENDS,
        dry=None,
    )


def step_logits(step: int, rows: int) -> mx.array:
    """Spread-out random logits whose end tokens are the most likely on every other step."""
    logits = mx.random.normal((rows, VOCAB), key=mx.random.key(step)) * 3
    if step % 2:
        logits[:, ENDS[step % 4 // 2]] = 20.0
    return logits


def test_rows_picked_together_pick_what_each_picks_alone() -> None:
    together = [sampler(**kind) for kind in KINDS]
    alone = [sampler(**kind) for kind in KINDS]
    # With logprobs a row goes through its sampler's own chain: the same picks.
    chained = [sampler(**kind, logprobs=1) for kind in KINDS]
    assert together[2].batch_key() == together[3].batch_key() is not None
    assert chained[2].batch_key() is None
    picked: list[list[int]] = []
    for step in range(STEPS):
        logits = step_logits(step, len(KINDS))
        rows = [sample.token for sample in sample_rows(together, logits)]
        one_by_one = [sample_rows([s], logits[i : i + 1])[0].token for i, s in enumerate(alone)]
        through_chain = [
            sample_rows([s], logits[i : i + 1])[0].token for i, s in enumerate(chained)
        ]
        assert rows == one_by_one == through_chain, step
        picked.append(rows)
    by_row = list(zip(*picked, strict=True))
    # Banned end tokens never come (ignore_eos; min_tokens for its first 10), though they
    # lead every other step; without a ban the greedy row takes them.
    assert not set(by_row[1]) & set(ENDS)
    assert not set(by_row[5]) & set(ENDS)
    assert not set(by_row[7][:10]) & set(ENDS)
    assert set(by_row[0]) & set(ENDS)
    # Each seeded row draws its own tokens.
    assert by_row[2] != by_row[3]
    assert len(set(by_row[4])) > STEPS // 2
