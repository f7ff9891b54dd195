"""POST /v1/embeddings and llama-server's /embedding: inputs to token ids (checked against the
model's length and the request limits) and images (`embedding_images.py`), vectors from the
shared batch, then normalization, `dimensions` and the encoding the request asks for."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Sequence
from typing import Any, cast

import numpy as np

from mlxcel.backends.embeddings import EncoderInfo
from mlxcel.engine.context import most_text_bytes
from mlxcel.engine.slots import common_prefix
from mlxcel.media.policy import MediaPolicy
from mlxcel.models.encoders import EmbeddingModel
from mlxcel.protocol.embeddings import (
    BareImage,
    ContentPrompt,
    EmbeddingInput,
    EmbeddingRequest,
    EmbeddingText,
    NativeEmbeddingRequest,
    TypedImage,
    TypedText,
)
from mlxcel.protocol.errors import APIError, invalid_request
from mlxcel.serving.embedding_images import (
    ImageInput,
    check_takes_images,
    image_input,
    image_vectors,
    read_images,
)
from mlxcel.serving.encoder_limits import EncoderLimits

Pieces = list[int | str]
Item = str | Pieces | ImageInput


def input_batch(value: EmbeddingInput, param: str) -> list[Item]:
    """The inputs an `input` field holds, as llama-server reads it: a text, a list with a token
    id in it is one input (ids, or ids and texts), any other list a batch of those; prompt
    objects stand for their text, typed items for their text or image."""
    if not isinstance(value, list):
        return [_item(value, param)]
    if any(isinstance(v, int) for v in value):
        if not all(isinstance(v, (int, str)) for v in value):
            raise invalid_request(
                "an input of token ids may hold texts, not lists or objects", param
            )
        return [cast(Pieces, value)]
    items = cast(Sequence[EmbeddingText | Pieces], value)
    return [v if isinstance(v, list) else _item(v, f"{param}.{i}") for i, v in enumerate(items)]


def _item(item: EmbeddingText, param: str) -> str | ImageInput:
    if isinstance(item, (TypedImage, BareImage)):
        return image_input(item, param)
    return _text(item, param)


async def joined(
    model: EmbeddingModel, inputs: list[str | Pieces], limits: EncoderLimits, param: str
) -> list[str | list[int]]:
    """Each input of ids and texts as token ids: ids as given, each text's tokens without the
    model's special tokens, those around the whole when it starts with text (llama-server adds
    them only then). Its texts are held to the sizes plain texts are, before tokenizing."""
    texts = [p for item in inputs if isinstance(item, list) for p in item if isinstance(p, str)]
    if not texts:
        return cast(list[str | list[int]], inputs)
    for text in texts:
        within_size(text, model.info, False, "a text among token ids", param)
    check_total_size(texts, model.info, limits, param)
    bare, one, *tokens = await model.tokenize(["", "a", *texts])
    # What the tokenizer puts around any text: [CLS] before and [SEP] after, say.
    head = common_prefix(bare, one)
    pieces = iter(t[head : len(t) - (len(bare) - head)] for t in tokens)
    out: list[str | list[int]] = []
    for item in inputs:
        if isinstance(item, str) or not _has_text(item):
            out.append(cast(str | list[int], item))
            continue
        ids = [i for p in item for i in ([p] if isinstance(p, int) else next(pieces))]
        out.append([*bare[:head], *ids, *bare[head:]] if isinstance(item[0], str) else ids)
    return out


def _has_text(item: Pieces) -> bool:
    return any(isinstance(piece, str) for piece in item)


def _text(item: EmbeddingText | TypedText, param: str) -> str:
    if isinstance(item, str):
        return item
    if isinstance(item, ContentPrompt):
        return "".join(part.text for part in item.content)
    if isinstance(item, TypedText):
        return item.text
    if isinstance(item, (TypedImage, BareImage)):
        raise invalid_request("an image here must be an input of its own", param)
    if item.multimodal_data:
        raise invalid_request("an embedding model takes text only", f"{param}.multimodal_data")
    return item.prompt_string


def too_many(what: str, count: int, limit: int, flag: str, param: str) -> APIError:
    """A 413: the request asks for more than a limit allows."""
    return APIError(
        413,
        f"{count} {what} in one request, more than the limit of {limit} ({flag})",
        param=param,
        code="request_too_large",
    )


def cut(ids: list[int], limit: int, end: int | None) -> list[int]:
    """The first `limit` tokens, ending with the model's end token as an uncut input does."""
    if len(ids) <= limit:
        return ids
    if end is not None and ids[-1] == end and limit > 1:
        return [*ids[: limit - 1], end]
    return ids[:limit]


def within_size(text: str, info: EncoderInfo, truncate: bool, what: str, param: str) -> str:
    """A text no longer than the model's longest input can be in bytes, checked before it is
    tokenized (a 30 MB input took 19-40 s to tokenize, then was refused): cut there when the
    request asks for truncation (the tokens kept are the same), else a 400 naming `param`."""
    limit = most_text_bytes(info.max_tokens, info.longest_token)
    data = text.encode()
    if len(data) <= limit:
        return text
    if not truncate:
        raise invalid_request(
            f"{what} is {len(data)} bytes, more than the model's maximum of {info.max_tokens} "
            "tokens can hold; shorten it or send truncate: true",
            param=param,
            code="input_too_long",
        )
    return data[:limit].decode(errors="ignore")


def check_total_size(
    texts: Sequence[str], info: EncoderInfo, limits: EncoderLimits, param: str
) -> None:
    """A 413 before tokenizing for texts together too long for --embedding-max-tokens."""
    size = sum(len(text.encode()) for text in texts)
    limit = most_text_bytes(limits.max_tokens, info.longest_token)
    if size > limit:
        raise APIError(
            413,
            f"the inputs are {size} bytes together, more than the limit of {limits.max_tokens} "
            "tokens (--embedding-max-tokens) can hold",
            param=param,
            code="request_too_large",
        )


async def token_inputs(
    model: EmbeddingModel,
    inputs: list[str | list[int]],
    *,
    prefix: str,
    truncate: bool,
    limits: EncoderLimits,
    param: str,
    query: bool = False,
    names: Sequence[str] | None = None,
) -> list[list[int]]:
    """Every input as token ids: texts tokenized (after `prefix`; as queries where `query`),
    ids checked against the vocabulary, each within the model's length (a late-interaction
    model's query length for queries; cut, or a 400 naming it: `names`, else "input N")."""
    info = model.info
    named = list(names) if names is not None else [f"input {i}" for i in range(len(inputs))]
    texts = [
        (i, within_size(prefix + t, info, truncate, named[i], param))
        for i, t in enumerate(inputs)
        if isinstance(t, str)
    ]
    check_total_size([t for _, t in texts], info, limits, param)
    tokenize = model.tokenize_queries if query else model.tokenize
    tokens = await tokenize([t for _, t in texts]) if texts else []
    tokenized = dict(zip((i for i, _ in texts), tokens, strict=True))
    longest = info.query_tokens if query and info.query_tokens else info.max_tokens
    out: list[list[int]] = []
    for index, item in enumerate(inputs):
        name = named[index]
        ids = tokenized.get(index) if isinstance(item, str) else item
        assert ids is not None
        if not ids:
            raise invalid_request(f"{name} is empty", param=param)
        bad = next((t for t in ids if not 0 <= t < info.vocab_size), None)
        if bad is not None:
            raise invalid_request(
                f"{name} has token id {bad}, outside the vocabulary (0..{info.vocab_size - 1})",
                param=param,
            )
        if len(ids) > longest:
            if not truncate:
                raise invalid_request(
                    f"{name} is {len(ids)} tokens, longer than the model's maximum of "
                    f"{longest}; shorten it or send truncate: true",
                    param=param,
                    code="input_too_long",
                )
            ids = cut(ids, longest, info.end_token)
        out.append(ids)
    total = sum(len(ids) for ids in out)
    if total > limits.max_tokens:
        raise too_many("tokens", total, limits.max_tokens, "--embedding-max-tokens", param)
    return out


def normalize(vector: np.ndarray, norm: int) -> np.ndarray:
    """llama-server's embd_normalize: -1 none, 0 max-abs (to int16 range), 1 taxicab,
    2 euclidean, p > 2 the p-norm; along the last axis."""
    if norm < 0:
        return vector
    peak = np.abs(vector).max(axis=-1, keepdims=True)
    if norm == 0:
        scale = peak / 32760.0
    elif norm <= 2:
        scale = np.linalg.norm(vector, ord=norm, axis=-1, keepdims=True)
    else:
        # Over the peak first: |x|**p of a small float underflows to 0 past p ~ 100, which
        # made the whole vector zeros; a ratio of at most 1 keeps the peak's term at 1.
        ratio = np.divide(np.abs(vector), peak, out=np.zeros_like(vector), where=peak > 0)
        total = (ratio.astype(np.float64) ** float(norm)).sum(axis=-1, keepdims=True)
        scale = (peak * total ** (1.0 / norm)).astype(vector.dtype)
    return cast(np.ndarray, np.divide(vector, scale, out=np.zeros_like(vector), where=scale > 0))


def shaped(
    vectors: list[np.ndarray], dimensions: int | None, norm: int, width: int
) -> list[np.ndarray]:
    """The request's `dimensions` (Matryoshka truncation) then its normalization."""
    if dimensions is not None and dimensions > width:
        raise invalid_request(
            f"'dimensions' is {dimensions}, more than the model's {width}", param="dimensions"
        )
    cut_to = dimensions or width
    return [normalize(v[..., :cut_to].astype(np.float32), norm) for v in vectors]


def encoded(vector: np.ndarray, encoding: str) -> Any:
    """A vector as floats, or base64 of its little-endian float32 bytes."""
    if encoding == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode()
    return vector.tolist()


def instruction_prefix(model: EmbeddingModel, instruction: str | None) -> str:
    """What goes before each text input: a named prompt of the model (`query`, ...), or the
    instruction text itself."""
    if instruction is None:
        return ""
    return model.info.prompts.get(instruction, instruction)


def search_side(model: EmbeddingModel, body: EmbeddingRequest) -> tuple[str, bool]:
    """The prefix before each text and whether the texts are read as queries: `input_type`
    is a late-interaction model's query or document form, another model's named prompt for
    the side (if it has one); else `instruction`."""
    if body.input_type is None:
        return instruction_prefix(model, body.instruction), False
    if body.instruction is not None:
        raise invalid_request("send 'instruction' or 'input_type', not both", "input_type")
    query = body.input_type in ("query", "search_query")
    if model.info.query_tokens:
        return "", query
    prompts = model.info.prompts
    prompt = prompts.get("query") if query else prompts.get("document", prompts.get("passage"))
    return prompt or "", False


async def raw_vectors(
    model: EmbeddingModel,
    name: str,
    value: EmbeddingInput,
    *,
    limits: EncoderLimits,
    policy: MediaPolicy,
    param: str,
    prefix: str = "",
    query: bool = False,
    truncate: bool = False,
) -> tuple[list[np.ndarray], int]:
    """Each input's raw vector (or matrix), texts and images in their order, and the tokens
    read (an image counts its patches). Everything is checked before anything is embedded."""
    items = input_batch(value, param)
    if not items:
        raise invalid_request(f"'{param}' is empty: give at least one input", param=param)
    if len(items) > limits.max_inputs:
        raise too_many("inputs", len(items), limits.max_inputs, "--embedding-max-inputs", param)
    images = [item for item in items if isinstance(item, ImageInput)]
    check_takes_images(model, images, name)
    places = [i for i, item in enumerate(items) if not isinstance(item, ImageInput)]
    texts = [cast(str | Pieces, items[i]) for i in places]
    ids = []
    if texts:
        ids = await token_inputs(
            model,
            await joined(model, texts, limits, param),
            prefix=prefix,
            truncate=truncate,
            limits=limits,
            param=param,
            query=query,
            names=[f"input {i}" for i in places],
        )
    encoded = await read_images(images, policy)
    text_vectors, pictures = await asyncio.gather(
        model.embed(ids), image_vectors(model, images, encoded)
    )
    by_place = dict(zip(places, text_vectors, strict=True))
    pictured = iter(pictures)
    vectors = [by_place[i] if i in by_place else next(pictured) for i in range(len(items))]
    tokens = sum(len(row) for row in ids) + len(images) * model.info.image_tokens
    return vectors, tokens


async def embeddings(
    model: EmbeddingModel,
    name: str,
    body: EmbeddingRequest,
    limits: EncoderLimits,
    policy: MediaPolicy,
) -> dict[str, Any]:
    """The OpenAI list of embeddings, with usage: a vector per input, or a matrix (a row per
    token kept) from a multi-vector model."""
    prefix, query = search_side(model, body)
    raw, tokens = await raw_vectors(
        model,
        name,
        body.input,
        limits=limits,
        policy=policy,
        param="input",
        prefix=prefix,
        query=query,
        truncate=body.truncate,
    )
    vectors = shaped(raw, body.dimensions, body.embd_normalize, model.info.dimensions)
    data = []
    for index, vector in enumerate(vectors):
        item: dict[str, Any] = {
            "object": "embedding",
            "index": index,
            "embedding": encoded(vector, body.encoding_format),
        }
        if vector.ndim == 2 and body.encoding_format == "base64":
            item["shape"] = list(vector.shape)
        data.append(item)
    return {
        "object": "list",
        "data": data,
        "model": name,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


async def native_embeddings(
    model: EmbeddingModel,
    name: str,
    body: NativeEmbeddingRequest,
    limits: EncoderLimits,
    policy: MediaPolicy,
) -> list[dict[str, Any]]:
    """llama-server's shape: one {index, embedding} per input, the embedding a list of
    vectors (one per token with pooling none, else the one pooled vector)."""
    raw, _ = await raw_vectors(
        model,
        name,
        body.content,
        limits=limits,
        policy=policy,
        param="content",
        truncate=body.truncate,
    )
    vectors = shaped(raw, None, body.embd_normalize, model.info.dimensions)
    return [
        {"index": i, "embedding": (v if v.ndim == 2 else v[None, :]).tolist()}
        for i, v in enumerate(vectors)
    ]
