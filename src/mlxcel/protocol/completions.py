"""POST /v1/completions request body."""

from __future__ import annotations

from pydantic import Field

from mlxcel.protocol.common import Prompt, Prompts, SamplingFields, prompt_batch


class CompletionRequest(SamplingFields):
    prompt: Prompts
    echo: bool = False
    logprobs: int | None = Field(default=None, ge=0, le=20)
    suffix: str | None = None
    best_of: int | None = None

    def unsupported(self) -> str | None:
        """The first field set to something this server does not do yet."""
        if self.best_of not in (None, 1, self.n):
            return "best_of"
        return None

    def top_logprobs_wanted(self) -> int | None:
        """None for no log-probabilities, else how many alternatives per token."""
        return self.logprobs if self.logprobs is not None else super().top_logprobs_wanted()

    def prompts(self) -> list[Prompt]:
        """The prompt as a list of prompts, each text, token ids or both."""
        return prompt_batch(self.prompt)
