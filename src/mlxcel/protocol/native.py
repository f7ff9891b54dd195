"""Request bodies of llama-server's own routes: /tokenize, /detokenize, /apply-template,
/completion."""

from __future__ import annotations

from pydantic import Field

from mlxcel.protocol.common import SamplingFields, Strict


class TokenizeRequest(Strict):
    content: str
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False
    model: str | None = None


class DetokenizeRequest(Strict):
    tokens: list[int]
    model: str | None = None


class NativeCompletionRequest(SamplingFields):
    """POST /completion: llama-server's fields; any other one is a 400 that names it."""

    prompt: str | list[int]
    n_predict: int | None = Field(default=None, ge=-1)
    # Reusing a cached prefix only changes speed, never the result, so the hint is accepted.
    cache_prompt: bool = True

    def unsupported(self) -> str | None:
        """The first field set to something this route does not do."""
        if self.n != 1:
            return "n"
        if self.stream_options is not None:
            return "stream_options"
        return super().unsupported()

    def token_limit(self) -> int | None:
        """n_predict, else max_tokens as llama-server falls back; -1 means no limit of its own."""
        limit = self.n_predict if self.n_predict is not None else self.max_tokens
        return None if limit == -1 else limit
