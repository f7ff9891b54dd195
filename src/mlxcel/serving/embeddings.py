"""POST /v1/embeddings and llama-server's /embedding: inputs to token ids (checked against the
model's length and the request limits), vectors from the shared batch, then normalization,
`dimensions` and the encoding the request asks for."""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any, cast

import numpy as np

from mlxcel.backends.embeddings import EncoderInfo
from mlxcel.engine.context import most_text_bytes
from mlxcel.engine.slots import common_prefix
from mlxcel.models.encoders import EmbeddingModel
from mlxcel.protocol.embeddings import (
    ContentPrompt,
    EmbeddingInput,
    EmbeddingRequest,
    EmbeddingText,
    NativeEmbeddingRequest,
)
from mlxcel.protocol.errors import APIError, invalid_request
from mlxcel.serving.encoder_limits import EncoderLimits

Pieces = list[int | str]


def input_batch(value: EmbeddingInput, param: str) -> list[str | Pieces]:
    """The inputs an `input` field holds, as llama-server reads it: a text, a list with a token
    id in it is one input (ids, or ids and texts), any other list a batch of those; prompt
    objects stand for their text."""
    if not isinstance(value, list):
        return [_text(value, param)]
    if any(isinstance(v, int) for v in value):
        if not all(isinstance(v, (int, str)) for v in value):
            raise invalid_request(
                "an input of token ids may hold texts, not lists or objects", param
            )
        return [cast(Pieces, value)]
    items = cast(Sequence[EmbeddingText | Pieces], value)
    return [v if isinstance(v, list) else _text(v, f"{param}.{i}") for i, v in enumerate(items)]


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


def _text(item: EmbeddingText, param: str) -> str:
    if isinstance(item, str):
        return item
    if isinstance(item, ContentPrompt):
        return "".join(part.text for part in item.content)
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
) -> list[list[int]]:
    """Every input as token ids: texts tokenized (after `prefix`), ids checked against the
    vocabulary, each within the model's length (cut, or a 400 naming it)."""
    if not inputs:
        raise invalid_request(f"'{param}' is empty: give at least one input", param=param)
    if len(inputs) > limits.max_inputs:
        raise too_many("inputs", len(inputs), limits.max_inputs, "--embedding-max-inputs", param)
    info = model.info
    texts = [
        (i, within_size(prefix + t, info, truncate, f"input {i}", param))
        for i, t in enumerate(inputs)
        if isinstance(t, str)
    ]
    check_total_size([t for _, t in texts], info, limits, param)
    tokens = await model.tokenize([t for _, t in texts]) if texts else []
    tokenized = dict(zip((i for i, _ in texts), tokens, strict=True))
    out: list[list[int]] = []
    for index, item in enumerate(inputs):
        ids = tokenized.get(index) if isinstance(item, str) else item
        assert ids is not None
        if not ids:
            raise invalid_request(f"input {index} is empty", param=param)
        bad = next((t for t in ids if not 0 <= t < info.vocab_size), None)
        if bad is not None:
            raise invalid_request(
                f"input {index} has token id {bad}, outside the vocabulary "
                f"(0..{info.vocab_size - 1})",
                param=param,
            )
        if len(ids) > info.max_tokens:
            if not truncate:
                raise invalid_request(
                    f"input {index} is {len(ids)} tokens, longer than the model's maximum of "
                    f"{info.max_tokens}; shorten it or send truncate: true",
                    param=param,
                    code="input_too_long",
                )
            ids = cut(ids, info.max_tokens, info.end_token)
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


async def embeddings(
    model: EmbeddingModel, name: str, body: EmbeddingRequest, limits: EncoderLimits
) -> dict[str, Any]:
    """The OpenAI list of embeddings, with usage."""
    inputs = await token_inputs(
        model,
        await joined(model, input_batch(body.input, "input"), limits, "input"),
        prefix=instruction_prefix(model, body.instruction),
        truncate=body.truncate,
        limits=limits,
        param="input",
    )
    vectors = shaped(
        await model.embed(inputs), body.dimensions, body.embd_normalize, model.info.dimensions
    )
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
    tokens = sum(len(ids) for ids in inputs)
    return {
        "object": "list",
        "data": data,
        "model": name,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


async def native_embeddings(
    model: EmbeddingModel, body: NativeEmbeddingRequest, limits: EncoderLimits
) -> list[dict[str, Any]]:
    """llama-server's shape: one {index, embedding} per input, the embedding a list of
    vectors (one per token with pooling none, else the one pooled vector)."""
    inputs = await token_inputs(
        model,
        await joined(model, input_batch(body.content, "content"), limits, "content"),
        prefix="",
        truncate=body.truncate,
        limits=limits,
        param="content",
    )
    vectors = shaped(await model.embed(inputs), None, body.embd_normalize, model.info.dimensions)
    return [
        {"index": i, "embedding": (v if v.ndim == 2 else v[None, :]).tolist()}
        for i, v in enumerate(vectors)
    ]
