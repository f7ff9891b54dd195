"""Request bodies of the embedding and rerank routes: OpenAI's, llama-server's, Jina/Cohere's
and Text Embeddings Inference's."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from mlxcel.protocol.chat import ImageURL
from mlxcel.protocol.native import MultimodalPrompt
from mlxcel.protocol.policy import NoEffect, Strict


class TextPart(Strict):
    type: Literal["text"]
    text: str


class ContentPrompt(Strict):
    """llama-server's input object of content parts: text only on an embedding model."""

    content: list[TextPart]


class TypedText(Strict):
    """A typed text input: `{"type": "text", "text": ...}`, or Jina's bare `{"text": ...}`."""

    type: Literal["text"] = "text"
    text: str


class TypedImage(Strict):
    """A typed image input: `{"type": "image_url", "image_url": {"url": ...}}` as in chat, its
    URL also bare (`"image_url": "..."`), with or without `type`."""

    type: Literal["image_url"] = "image_url"
    image_url: ImageURL | str


class BareImage(Strict):
    """Jina's and infinity's `{"image": ...}`: a URL, a data: URI or bare base64."""

    type: Literal["image"] = "image"
    image: str


# A text (llama-server's prompt objects too), token ids and texts in one list
# ([12, 34, "text"]), a typed text or image, or a batch of those mixed.
TypedInput = TypedText | TypedImage | BareImage
EmbeddingText = str | MultimodalPrompt | ContentPrompt | TypedInput
EmbeddingInput = EmbeddingText | list[int | EmbeddingText | list[int | str]]
# Which side of a search the inputs are: a late-interaction model reads a query apart from a
# document; another model applies its own named prompt for the side, if it has one. Cohere's
# names too.
InputType = Literal["query", "document", "search_query", "search_document"]
# llama-server reads embd_normalize into a C int; past it numpy cannot raise to the power.
MAX_NORM = 2**31 - 1


class EmbeddingRequest(Strict):
    """POST /v1/embeddings (OpenAI), with llama-server's and our extensions."""

    input: EmbeddingInput
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, ge=1)
    user: Annotated[str | None, NoEffect("nothing here keeps per-user state")] = None
    # llama-server's: -1 none, 0 max-abs, 1 taxicab, 2 euclidean, >2 p-norm.
    embd_normalize: int = Field(default=2, ge=-1, le=MAX_NORM)
    instruction: str | None = None
    input_type: InputType | None = None
    truncate: bool = False


class NativeEmbeddingRequest(Strict):
    """llama-server's POST /embedding: `content`, answered in its own shape."""

    content: EmbeddingInput
    model: str | None = None
    embd_normalize: int = Field(default=2, ge=-1, le=MAX_NORM)
    pooling: Literal["none", "model"] = "model"
    """`none`: one vector per token; `model`: the model's own pooling."""
    truncate: bool = False


class RerankDocument(Strict):
    text: str


class RerankRequest(Strict):
    """POST /v1/rerank: Jina's and Cohere's shape (`documents`), or TEI's (`texts`)."""

    query: str
    model: str | None = None
    documents: list[str | RerankDocument] | None = None
    top_n: int | None = Field(default=None, ge=1)
    return_documents: bool = True
    # Cohere's v2 field: each document cut to this many tokens.
    max_tokens_per_doc: int | None = Field(default=None, ge=1)
    # TEI's fields, with `texts`.
    texts: list[str] | None = None
    raw_scores: bool = False
    return_text: bool = False
    truncate: bool = False
    truncation_direction: Literal["right", "Right"] = "right"
    user: Annotated[str | None, NoEffect("nothing here keeps per-user state")] = None
