"""The scheduler's side of speculative decoding: which sequences draft, and their drafts for
a step (speculative.py says how drafts are made and why verifying them is exact)."""

from __future__ import annotations

from collections.abc import Sequence

from mlxcel.engine.capabilities import DraftsWithModel, VerifiesDrafts
from mlxcel.engine.sequence import Job, Running
from mlxcel.engine.speculative import Drafter, NgramDrafter, SpeculativeConfig, longest_timed
from mlxcel.engine.types import TextGenerator


class Speculation:
    """Drafts for the running sequences of one generator: prompt lookups, or its draft
    model's (when it has one), for a generator whose step verifies them."""

    def __init__(self, generator: TextGenerator, config: SpeculativeConfig | None) -> None:
        self._generator = generator
        verifies = isinstance(generator, VerifiesDrafts) and generator.verifies_drafts
        self._config = config if verifies else None
        self._model: DraftsWithModel | None = None
        if isinstance(generator, DraftsWithModel) and generator.drafts_with_model:
            self._model = generator

    def drafter(self, job: Job) -> Drafter | None:
        """The job's drafts, when the model speculates (never over an image's placeholders)."""
        config = self._config
        if config is None or job.media:
            return None
        return Drafter(config, job.prompt) if self._model else NgramDrafter(config, job.prompt)

    def drafts(self, decoding: Sequence[Running], budget: int) -> list[tuple[int, ...]]:
        """Each decoding sequence's draft, within `budget` tokens of the batch in all; a draft
        model drafts for every sequence in the same decodes, each cut to a length whose
        verification was timed. None is shorter than draft-min."""
        config = self._config
        if config is None:
            return [() for _ in decoding]
        drafts: list[tuple[int, ...]] = []
        limits = []
        for running in decoding:
            limit = min(budget, self._limit(running))
            drafter = running.drafter
            if self._model is None:
                draft = drafter.propose(limit) if isinstance(drafter, NgramDrafter) else ()
                drafts.append(draft)
                budget -= len(draft)
            else:
                limit = longest_timed(config, limit)
                limits.append(limit)
                budget -= limit
        if self._model is None:
            return drafts
        requests = [
            (r.slot, r.drafter.tokens if r.drafter else [], limit)
            for r, limit in zip(decoding, limits, strict=True)
        ]
        return [d[: longest_timed(config, len(d))] for d in self._model.draft(requests)]

    def prompt_fed(self, running: Running) -> None:
        """A chunk of the sequence's prompt was evaluated: the draft model evaluates it too,
        so its first draft does not wait for the whole prompt."""
        if self._model is not None and running.drafter is not None:
            self._model.draft([(running.slot, running.job.prompt[: running.fed], 0)])

    def _limit(self, running: Running) -> int:
        """The most tokens worth drafting after the sequence's last one: no more than
        draft-max, the request's max_tokens and the context leave room for."""
        if running.drafter is None or self._config is None:
            return 0
        params = running.job.params
        room = min(params.max_tokens, self._generator.n_ctx_seq - len(running.job.prompt))
        return max(0, min(room - running.generated - 1, self._config.size_m))
