"""Request bodies of llama-server's own routes: /tokenize, /detokenize, /apply-template,
/completion."""

from __future__ import annotations

from pydantic import Field

from mlxcel.protocol.common import Prompts, SamplingFields
from mlxcel.protocol.policy import Strict


class TokenizeRequest(Strict):
    content: str
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False
    model: str | None = None


class DetokenizeRequest(Strict):
    tokens: list[int]
    model: str | None = None


class MultimodalPrompt(Strict):
    """llama-server's prompt with media: text whose `<__media__>` markers stand for the items
    of `multimodal_data` in order, each a base64 file (an image, or an audio clip for a model
    that hears)."""

    prompt_string: str
    multimodal_data: list[str] = Field(default_factory=list)


class NativeCompletionRequest(SamplingFields):
    """POST /completion: llama-server's fields; any other one is a 400 that names it."""

    prompt: Prompts | MultimodalPrompt
    return_tokens: bool = False
    # Keep only these fields of the answer; "a/b" takes b out of a, under the name "a/b".
    response_fields: list[str] | None = None

    def unsupported(self) -> str | None:
        """The first field set to something this route does not do."""
        if self.n != 1:
            return "n"
        if self.stream_options is not None:
            return "stream_options"
        return super().unsupported()
