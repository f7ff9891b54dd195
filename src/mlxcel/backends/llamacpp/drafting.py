"""Speculative decoding on llama.cpp: a draft model's greedy drafts, and what verifying a
draft of each length costs on this machine (engine/speculative.py sizes drafts from it)."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np

from mlxcel.backends.llamacpp import native
from mlxcel.backends.llamacpp.model import LlamaCppOptions, model_params, new_context
from mlxcel.engine.speculative import DraftCosts

logger = logging.getLogger(__name__)

_get_logits_ith = native.holding_gil("llama_get_logits_ith")
_memory_seq_rm = native.holding_gil("llama_memory_seq_rm")

# A draft stops at a token its model gives less than this probability (llama-server's
# --draft-p-min default): past it, the target rarely agrees and the rest is wasted work.
DRAFT_P_MIN = 0.75
# Rounds of the decodes timed to measure what verifying a draft costs.
_TIMINGS = 3

DraftRequest = tuple[int, Sequence[int], int]
"""One sequence to draft for: its slot, its tokens so far (prompt and output, the last one
not yet evaluated by the target) and the most tokens to draft."""


def decode(ctx: Any, batch: Any, n: int) -> None:
    """llama_decode of the batch's first `n` rows."""
    batch.n_tokens = n
    status = llama_cpp.llama_decode(ctx, batch)
    if status != 0:
        raise RuntimeError(f"llama_decode failed with status {status}")


def draft_costs(ctx: Any, batch: Any, memory: Any, seq: int, lengths: Sequence[int]) -> DraftCosts:
    """What verifying a draft of each length costs, in one-token decodes: the least process
    time of a few decodes of 1 + d tokens with logits at every one (as verification asks),
    against that of one token, after a short prompt, on sequence `seq` (left empty)."""
    start = 32
    for i in range(start):
        native.put_token(batch, i, 0, i, seq, False)
    decode(ctx, batch, start)

    def timed(width: int) -> float:
        for i in range(width):
            native.put_token(batch, i, 0, start + i, seq, True)
        began = time.process_time()
        decode(ctx, batch, width)
        spent = time.process_time() - began
        _memory_seq_rm(memory, seq, start, -1)
        return spent

    widths = [1, *(d + 1 for d in lengths)]
    # Interleaved, so that a burst of load elsewhere slows every width alike.
    rounds = [[timed(width) for width in widths] for _ in range(_TIMINGS)]
    _memory_seq_rm(memory, seq, -1, -1)
    least = [min(times) for times in zip(*rounds, strict=True)]
    one = max(least[0], 1e-6)
    return tuple((d, max(1.0, t / one)) for d, t in zip(lengths, least[1:], strict=True))


def same_vocabulary(ours: Any, theirs: Any) -> str | None:
    """How two vocabularies differ (size, or the first token whose text differs), or None."""
    size, other = llama_cpp.llama_vocab_n_tokens(ours), llama_cpp.llama_vocab_n_tokens(theirs)
    if size != other:
        return f"{other} tokens against the model's {size}"
    for token in range(size):
        mine = native.token_piece(ours, token, special=True)
        other_piece = native.token_piece(theirs, token, special=True)
        if other_piece != mine:
            return f"token {token} is {mine!r} in the model, {other_piece!r} in the draft"
    return None


class DraftModel:
    """A second GGUF of the target's vocabulary, drafting greedily for each of its slots.

    Its KV cache holds one sequence per target slot (the same ids). What each holds is kept
    as tokens: a draft call first drops what no longer matches the slot's tokens (the rejected
    part of its last draft, or a different prompt), evaluates the rest, then drafts one token
    per decode for every sequence together until each stops (its limit, an end of generation,
    or a token below DRAFT_P_MIN).
    """

    def __init__(self, path: Path, options: LlamaCppOptions, target_vocab: Any) -> None:
        model = llama_cpp.llama_model_load_from_file(str(path).encode(), model_params(options))
        if model is None:
            raise ValueError(f"llama.cpp could not load the draft model {path}")
        self._model = model
        self._vocab = llama_cpp.llama_model_get_vocab(model)
        differs = same_vocabulary(target_vocab, self._vocab)
        if differs is not None:
            llama_cpp.llama_model_free(model)
            raise ValueError(
                f"the draft model {path} has another vocabulary than the model ({differs})"
            )
        self._ctx = new_context(model, options)
        self._memory = llama_cpp.llama_get_memory(self._ctx)
        self._max_feed = int(llama_cpp.llama_n_batch(self._ctx))
        self._batch = llama_cpp.llama_batch_init(self._max_feed, 0, 1)
        self._n_vocab = int(llama_cpp.llama_vocab_n_tokens(self._vocab))
        self._held: list[list[int]] = [[] for _ in range(options.parallel)]

    def draft(self, requests: Sequence[DraftRequest]) -> list[tuple[int, ...]]:
        """Each request's greedy draft, every sequence drafted in the same decodes; one with a
        limit of 0 only catches up (evaluates its tokens but the last, as its prompt is fed).

        Drafts only speed generation up: a draft decode that fails is logged, the sequences'
        draft state is dropped (the next call evaluates them again), and no drafts are made."""
        try:
            return self._draft(requests)
        except Exception:
            logger.exception("the draft model failed: this step verifies no drafts")
            for slot, _, _ in requests:
                self.forget(slot)
            return [() for _ in requests]

    def _draft(self, requests: Sequence[DraftRequest]) -> list[tuple[int, ...]]:
        drafts: list[list[int]] = [[] for _ in requests]
        for slot, tokens, _ in requests:
            if tokens:
                self._catch_up(slot, tokens)
        # In slot order, as the target's rows are (generator._decode_tokens says why).
        live = [i for i, (_, tokens, limit) in enumerate(requests) if limit > 0 and tokens]
        live.sort(key=lambda i: requests[i][0])
        nexts = {i: requests[i][1][-1] for i in live}
        while live:
            for row, i in enumerate(live):
                slot = requests[i][0]
                native.put_token(self._batch, row, nexts[i], len(self._held[slot]), slot, True)
                self._held[slot].append(nexts[i])
            decode(self._ctx, self._batch, len(live))
            going = []
            for row, i in enumerate(live):
                token = self._greedy(row)
                if token is None:
                    continue
                drafts[i].append(token)
                if len(drafts[i]) < requests[i][2]:
                    nexts[i] = token
                    going.append(i)
            live = going
        return [tuple(d) for d in drafts]

    def _catch_up(self, slot: int, tokens: Sequence[int]) -> None:
        """Bring the slot's sequence to all of `tokens` but the last."""
        held = self._held[slot]
        common = 0
        for mine, theirs in zip(held, tokens[:-1], strict=False):
            if mine != theirs:
                break
            common += 1
        if common < len(held):
            _memory_seq_rm(self._memory, slot, common, -1)
            del held[common:]
        rest = tokens[common:-1]
        for chunk in range(0, len(rest), self._max_feed):
            part = rest[chunk : chunk + self._max_feed]
            for row, token in enumerate(part):
                native.put_token(self._batch, row, token, len(held) + row, slot, False)
            decode(self._ctx, self._batch, len(part))
            held.extend(part)

    def _greedy(self, row: int) -> int | None:
        """The most likely token at a batch row, or None where drafting stops there."""
        logits = np.ctypeslib.as_array(_get_logits_ith(self._ctx, row), shape=(self._n_vocab,))
        token = int(logits.argmax())
        if llama_cpp.llama_vocab_is_eog(self._vocab, token):
            return None
        share = 1.0 / float(np.exp(logits - logits[token]).sum())
        return token if share >= DRAFT_P_MIN else None

    def forget(self, slot: int) -> None:
        """The slot's sequence is gone (the target's was cleared)."""
        _memory_seq_rm(self._memory, slot, -1, -1)
        self._held[slot].clear()

    def close(self) -> None:
        llama_cpp.llama_batch_free(self._batch)
        llama_cpp.llama_free(self._ctx)
        llama_cpp.llama_model_free(self._model)
