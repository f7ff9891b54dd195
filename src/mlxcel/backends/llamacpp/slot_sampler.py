"""One sequence's sampling on llama.cpp: its sampler chain, the constraint of its grammar, the
tokens banned until min_tokens, and the log-probabilities it reports."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import llama_cpp
import numpy as np

from mlxcel.backends.guidance import Constraint
from mlxcel.backends.llamacpp import native
from mlxcel.backends.llamacpp.sampling import sample_after_chain, sample_with_logprobs
from mlxcel.engine.types import Sample, SamplingParams

# The calls the engine thread makes for every token (native.holding_gil says why).
_sampler_sample = native.holding_gil("llama_sampler_sample")
_sampler_accept = native.holding_gil("llama_sampler_accept")
_get_logits_ith = native.holding_gil("llama_get_logits_ith")


@dataclass
class SlotSampler:
    """One sequence's sampler chain and what it needs to rebuild it."""

    params: SamplingParams
    chain: Any
    banned: tuple[int, ...]
    guided: Constraint | None
    """llguidance's state for the request's JSON schema or lark grammar, if it has one."""
    n_vocab: int
    end: int
    """The end-of-generation token a finished grammar ends with."""
    rebuild: Callable[[SamplingParams], Any]
    """A new chain for these params, without bans."""
    sampled: list[int] = field(default_factory=list)

    def sample(self, ctx: Any, index: int) -> Sample:
        """The next token from output `index` of the last decode, with its log-probabilities
        when asked for."""
        params = self.params
        if self.guided is not None:
            if self.guided.finished:
                # The grammar is complete: end here, whatever min_tokens or ignore_eos would ban.
                return Sample(self.end)
            # Every sampler in the chain reads these logits: the disallowed ones go first.
            logits = np.ctypeslib.as_array(_get_logits_ith(ctx, index), shape=(self.n_vocab,))
            logits[~self.guided.allowed()] = -np.inf
        sample = None
        if params.post_sampling_probs and params.logprobs is not None:
            greedy = params.temperature <= 0
            sample = sample_after_chain(
                self.chain, ctx, index, self.n_vocab, params.logprobs, greedy=greedy
            )
            token = sample.token
        else:
            token = int(_sampler_sample(self.chain, ctx, index))
        if self.guided is not None:
            self.guided.advance(token)
        self.sampled.append(token)
        if self.banned and not params.ignore_eos:
            self._lift_ban_after_min_tokens()
        if sample is not None:
            return sample
        if params.logprobs is None:
            return Sample(token)
        return sample_with_logprobs(ctx, index, self.n_vocab, token, params.logprobs)

    def _lift_ban_after_min_tokens(self) -> None:
        """Once min_tokens are out, end-of-generation tokens are allowed again."""
        if len(self.sampled) < self.params.min_tokens:
            return
        llama_cpp.llama_sampler_free(self.chain)
        self.chain = self.rebuild(self.params)
        self.banned = ()
        # Penalty and DRY samplers remember what was generated: replay it.
        for token in self.sampled:
            _sampler_accept(self.chain, token)
