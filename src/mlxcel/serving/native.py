"""llama-server's own routes: tokens, templates, server properties and /completion objects."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from importlib.metadata import version
from typing import Any

from mlxcel.engine.types import SamplingParams, TextGenerator, TokenEvent
from mlxcel.models.loaded import LoadedModel
from mlxcel.protocol.chat import ChatCompletionRequest
from mlxcel.protocol.common import SamplingFields
from mlxcel.protocol.native import (
    DetokenizeRequest,
    NativeCompletionRequest,
    TokenizeRequest,
)
from mlxcel.serving.chat import chat_prompt, chat_text
from mlxcel.serving.chat_template import CHATML
from mlxcel.serving.errors import APIError, invalid_request
from mlxcel.serving.sampling import sampling_params
from mlxcel.serving.text import Generation, check_vocabulary, events, new_id, prepare, start

# What llama-server reports as the seed of a request that asked for none (LLAMA_DEFAULT_SEED).
RANDOM_SEED = 0xFFFFFFFF


def _piece(data: bytes) -> str | list[int]:
    """A token's text, or its bytes when they are not valid UTF-8 on their own (llama-server)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return list(data)


def tokenize(model: LoadedModel, request: TokenizeRequest) -> dict[str, Any]:
    """POST /tokenize: ids, or {id, piece} objects when pieces are asked for."""
    generator = model.generator
    ids = generator.tokenize(
        request.content, add_special=request.add_special, parse_special=request.parse_special
    )
    if not request.with_pieces:
        return {"tokens": ids}
    return {
        "tokens": [{"id": t, "piece": _piece(generator.token_bytes(t, special=True))} for t in ids]
    }


def detokenize_ids(generator: TextGenerator, tokens: Sequence[int]) -> str:
    """The text of some token ids, with broken UTF-8 replaced."""
    data = b"".join(generator.token_bytes(t, special=True) for t in tokens)
    return data.decode("utf-8", errors="replace")


def detokenize(model: LoadedModel, request: DetokenizeRequest) -> dict[str, str]:
    """POST /detokenize."""
    check_vocabulary(model.generator, request.tokens, "tokens")
    return {"content": detokenize_ids(model.generator, request.tokens)}


def apply_template(
    model: LoadedModel, request: ChatCompletionRequest, tool_parser: str
) -> dict[str, str]:
    """POST /apply-template: the prompt a chat request would run, with its tools, template
    kwargs and reasoning effort, generation prompt included."""
    return {"prompt": chat_text(model, request, tool_parser)}


def count_input_tokens(
    model: LoadedModel, request: ChatCompletionRequest, tool_parser: str
) -> dict[str, Any]:
    """POST /v1/chat/completions/input_tokens: the prompt length the chat route would run.

    A prompt longer than the context is still counted: that is what counting is for.
    """
    unsupported = request.unsupported()
    if unsupported is not None:
        # The chat route refuses these, so a count that left them out would be wrong.
        raise invalid_request(
            f"'{unsupported}' is not supported by this server yet", unsupported, "unsupported_field"
        )
    return {
        "object": "response.input_tokens",
        "input_tokens": len(chat_prompt(model, request, tool_parser)),
    }


def generation_settings(params: SamplingParams, *, stream: bool) -> dict[str, Any]:
    """Resolved sampling in llama-server's `generation_settings` shape."""
    settings = dataclasses.asdict(params)
    settings["seed"] = RANDOM_SEED if params.seed is None else params.seed
    settings["n_predict"] = params.max_tokens
    settings["stream"] = stream
    return settings


def props(model: LoadedModel, n_predict: int) -> dict[str, Any]:
    """GET /props: what a request that sets nothing gets, and what the server runs."""
    generator = model.generator
    n_ctx = generator.n_ctx_seq
    defaults = sampling_params(
        SamplingFields(),
        None,
        defaults=model.defaults,
        n_predict=n_predict,
        room=n_ctx,
        n_ctx=n_ctx,
    )
    # llama-server shows the server's own limit here (-1: none), not one request's.
    settings = generation_settings(defaults, stream=False)
    params = {**settings, "n_predict": n_predict, "max_tokens": n_predict}
    template = model.chat_template
    return {
        "default_generation_settings": {"n_ctx": n_ctx, "params": params},
        "total_slots": generator.n_slots,
        "batched_decode": generator.batched,
        "model_alias": model.name,
        "model_path": str(model.path),
        "modalities": {"vision": False, "audio": False},
        "chat_template": template.source if template else CHATML,
        "build_info": f"mlxcel {version('mlxcel')}",
        "is_sleeping": False,
    }


@dataclass
class NativeGeneration:
    """A /completion request ready to run: the engine's part and what the answer reports."""

    generation: Generation
    prompt_text: str
    stream: bool


def prepare_native(
    model: LoadedModel, request: NativeCompletionRequest, n_predict: int
) -> NativeGeneration:
    """Tokenize a text prompt as the GGUF says (ids are taken as they are); resolve sampling."""
    generator = model.generator
    if isinstance(request.prompt, str):
        prompt = generator.tokenize(
            request.prompt, add_special=generator.add_bos, parse_special=True
        )
    else:
        check_vocabulary(generator, request.prompt, "prompt")
        prompt = list(request.prompt)
    return native_generation(model, request, prompt, n_predict)


def native_generation(
    model: LoadedModel, request: NativeCompletionRequest, prompt: list[int], n_predict: int
) -> NativeGeneration:
    """A /completion-shaped generation of prompt tokens (/completion's, /infill's)."""
    generator = model.generator
    limit = request.token_limit()
    generation = prepare(model, new_id("cmpl"), prompt, request, limit, n_predict)
    if limit == 0:
        # llama-server then only evaluates the prompt; with no prompt cache, nothing is run.
        generation.params = dataclasses.replace(generation.params, max_tokens=0)
    text = detokenize_ids(generator, prompt)
    return NativeGeneration(generation, text, request.stream)


@dataclass
class _Clock:
    """Prompt time runs to the first event, generation time from there to the end."""

    start: float = field(default_factory=time.perf_counter)
    first: float | None = None

    def tick(self) -> None:
        if self.first is None:
            self.first = time.perf_counter()

    def timings(self, prompt_n: int, predicted_n: int) -> dict[str, float | int]:
        end = time.perf_counter()
        first = end if self.first is None else self.first
        prompt_ms = (first - self.start) * 1e3
        predicted_ms = (end - first) * 1e3
        return {
            "cache_n": 0,
            "prompt_n": prompt_n,
            "prompt_ms": prompt_ms,
            "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
            "prompt_per_second": 1e3 * prompt_n / prompt_ms if prompt_ms else 0.0,
            "predicted_n": predicted_n,
            "predicted_ms": predicted_ms,
            "predicted_per_token_ms": predicted_ms / predicted_n if predicted_n else 0.0,
            "predicted_per_second": 1e3 * predicted_n / predicted_ms if predicted_ms else 0.0,
        }


def _stop_type(event: TokenEvent) -> str:
    if event.stop_reason == "word":
        return "word"
    return "limit" if event.finish_reason == "length" else "eos"


def _final(
    native: NativeGeneration, content: str, text: str, event: TokenEvent, clock: _Clock
) -> dict[str, Any]:
    """The last object: `content` is empty when streaming, `text` is everything generated."""
    generation = native.generation
    prompt_n, predicted_n = event.prompt_tokens, event.completion_tokens
    return {
        "index": 0,
        "content": content,
        "tokens": [],
        # The engine does not say which slot ran the request.
        "id_slot": -1,
        "stop": True,
        "model": generation.model.name,
        "tokens_predicted": predicted_n,
        "tokens_evaluated": prompt_n,
        "generation_settings": generation_settings(generation.params, stream=native.stream),
        "prompt": native.prompt_text,
        "has_new_line": "\n" in text,
        "truncated": prompt_n + predicted_n >= generation.model.generator.n_ctx_seq,
        "stop_type": _stop_type(event),
        "stopping_word": event.stop_word or "",
        "tokens_cached": 0,
        "timings": clock.timings(prompt_n, predicted_n),
    }


async def _events(native: NativeGeneration) -> AsyncIterator[TokenEvent]:
    generation = native.generation
    if generation.params.max_tokens == 0:
        yield TokenEvent("", (), "length", len(generation.prompt), 0, stop_reason="limit")
        return
    async for event in events(start(generation), generation):
        yield event


async def native_chunks(native: NativeGeneration) -> AsyncIterator[dict[str, Any]]:
    """Streamed /completion objects: text as it comes, then the final object with `stop` true."""
    clock = _Clock()
    parts: list[str] = []
    async for event in _events(native):
        clock.tick()
        if event.text:
            parts.append(event.text)
            yield {
                "index": 0,
                "content": event.text,
                "tokens": list(event.token_ids),
                "stop": False,
            }
        if event.finish_reason is not None:
            yield _final(native, "", "".join(parts), event, clock)


async def native_completion(native: NativeGeneration) -> dict[str, Any]:
    """The whole /completion answer as one object."""
    parts: list[str] = []
    async for chunk in native_chunks(native):
        if chunk["stop"]:
            return {**chunk, "content": "".join(parts)}
        parts.append(chunk["content"])
    raise APIError(500, "generation ended without a final object")
