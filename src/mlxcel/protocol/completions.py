"""POST /v1/completions request body."""

from __future__ import annotations

from typing import cast

from pydantic import Field

from mlxcel.protocol.common import SamplingFields


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool = False
    logprobs: int | None = Field(default=None, ge=0, le=20)
    suffix: str | None = None
    best_of: int | None = None

    def unsupported(self) -> str | None:
        """The first field set to something this server does not do yet."""
        if self.best_of not in (None, 1, self.n):
            return "best_of"
        if self.echo and self.logprobs is not None:
            return "echo"
        return None

    def top_logprobs_wanted(self) -> int | None:
        """None for no log-probabilities, else how many alternatives per token."""
        return self.logprobs

    def prompts(self) -> list[str] | list[list[int]]:
        """The prompt as a list of prompts, each text or token ids."""
        prompt = self.prompt
        if isinstance(prompt, str):
            return [prompt]
        if prompt and all(isinstance(p, int) for p in prompt):
            return [cast(list[int], prompt)]
        return cast(list[str] | list[list[int]], prompt)

    def token_limit(self) -> int | None:
        """max_tokens (the completions API has no max_completion_tokens)."""
        return self.max_tokens
