"""Request bodies of llama-server's own routes: /tokenize, /detokenize, /apply-template,
/completion."""

from __future__ import annotations

from typing import cast

from pydantic import Field

from mlxcel.protocol.common import Prompt, Prompts, SamplingFields, prompt_batch
from mlxcel.protocol.errors import invalid_request
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


# /completion's prompt: llama-server's prompt object alone (with media), or in a batch beside
# texts and token lists (text only there).
NativePrompts = Prompts | MultimodalPrompt | list[str | list[int | str] | MultimodalPrompt]


def native_batch(prompt: Prompts | list[str | list[int | str] | MultimodalPrompt]) -> list[Prompt]:
    """The prompts of a /completion batch, a prompt object taken as its text: media go with a
    prompt object alone, where the route loads them."""
    if not isinstance(prompt, list) or not any(isinstance(p, MultimodalPrompt) for p in prompt):
        return prompt_batch(cast(Prompts, prompt))
    batch: list[Prompt] = []
    for index, item in enumerate(prompt):
        if not isinstance(item, MultimodalPrompt):
            batch.append(cast(Prompt, item))
        elif item.multimodal_data:
            raise invalid_request(
                "multimodal_data goes with a prompt object alone, not in a batch",
                f"prompt.{index}.multimodal_data",
            )
        else:
            batch.append(item.prompt_string)
    return batch


class NativeCompletionRequest(SamplingFields):
    """POST /completion: llama-server's fields; any other one is a 400 that names it."""

    prompt: NativePrompts
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
