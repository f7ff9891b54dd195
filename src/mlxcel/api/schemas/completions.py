"""POST /v1/completions request body."""

from __future__ import annotations

from mlxcel.api.schemas.common import SamplingFields


class CompletionRequest(SamplingFields):
    prompt: str
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None

    def unsupported(self) -> str | None:
        """The first field set to something this server does not do yet."""
        if self.echo:
            return "echo"
        if self.suffix:
            return "suffix"
        if self.best_of not in (None, 1):
            return "best_of"
        return super().unsupported()

    def token_limit(self) -> int | None:
        """max_tokens (the completions API has no max_completion_tokens)."""
        return self.max_tokens
