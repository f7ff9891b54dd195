"""llama-server's own routes: tokens, templates, server properties and /completion objects."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import mlxcel
from mlxcel.engine.capabilities import ReportsDevices, ReportsKvCache
from mlxcel.engine.types import SamplingParams, TextModel, TokenEvent, TokenLogprob
from mlxcel.media.audio import SentMedia
from mlxcel.media.images import LLAMA_MEDIA_MARKER, MEDIA_MARKER
from mlxcel.models.adapters import AdapterTable
from mlxcel.models.loaded import LoadedModel
from mlxcel.protocol.chat import ChatCompletionRequest
from mlxcel.protocol.common import SamplingFields
from mlxcel.protocol.errors import APIError, invalid_request
from mlxcel.protocol.native import (
    DetokenizeRequest,
    MultimodalPrompt,
    NativeCompletionRequest,
    TokenizeRequest,
    native_batch,
)
from mlxcel.serving.chat import chat_prompt, chat_text
from mlxcel.serving.chat_template import CHATML
from mlxcel.serving.logprobs import post_sampling
from mlxcel.serving.sampling import sampling_params
from mlxcel.serving.text import (
    Generation,
    Outcome,
    collect_all,
    finished,
    new_id,
    prepare_choices,
    stream_all,
)
from mlxcel.serving.timings import timings_of
from mlxcel.serving.tokens import (
    check_text_size,
    check_vocabulary,
    detokenize_ids,
    tokenize_prompt,
)
from mlxcel.serving.vision import laid_out

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
    check_text_size(generator, request.content, "content")
    ids = generator.tokenize(
        request.content, add_special=request.add_special, parse_special=request.parse_special
    )
    if not request.with_pieces:
        return {"tokens": ids}
    pieces = generator.token_pieces(ids, special=True)
    return {"tokens": [{"id": t, "piece": _piece(p)} for t, p in zip(ids, pieces, strict=True)]}


def detokenize(model: LoadedModel, request: DetokenizeRequest) -> dict[str, str]:
    """POST /detokenize."""
    check_vocabulary(model.generator, request.tokens, "tokens")
    return {"content": detokenize_ids(model.generator, request.tokens)}


def apply_template(
    model: LoadedModel, request: ChatCompletionRequest, tool_parser: str
) -> dict[str, str]:
    """POST /apply-template: the prompt a chat request would run, with its tools, template
    kwargs and reasoning effort, generation prompt included."""
    return {
        "prompt": chat_text(model, request, tool_parser).replace(MEDIA_MARKER, LLAMA_MEDIA_MARKER)
    }


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


def generation_settings(
    params: SamplingParams, *, stream: bool, adapters: AdapterTable | None = None
) -> dict[str, Any]:
    """Resolved sampling in llama-server's `generation_settings` shape (its LoRA adapters as
    llama-server's `lora`: every adapter's id and the scale the request ran it at)."""
    settings = dataclasses.asdict(params)
    scales = dict(settings.pop("adapters"))
    settings["lora"] = [{"id": a.id, "scale": scales.get(a.name, 0.0)} for a in adapters or ()]
    settings["seed"] = RANDOM_SEED if params.seed is None else params.seed
    settings["n_predict"] = params.max_tokens
    settings["n_probs"] = params.logprobs or 0
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
        "modalities": {
            "vision": "image" in generator.input_modalities,
            "audio": "audio" in generator.input_modalities,
        },
        # A prompt's image (or audio window) is evaluated in a llama_decode of its own; the
        # other sequences of that step still share one.
        "image_decode": "own_batch" if len(generator.input_modalities) > 1 else None,
        "chat_template": template.source if template else CHATML,
        "build_info": f"mlxcel {mlxcel.__version__}",
        "is_sleeping": False,
        **_kv_cache(generator),
        **device_split(generator),
    }


def device_split(generator: object) -> dict[str, Any]:
    """`devices` where the engine says which devices hold the layers: each one's name, what
    it is (an RPC host as it was named), its memory and its share of the layers."""
    devices = generator.devices if isinstance(generator, ReportsDevices) else ()
    if not devices:
        return {}
    return {
        "devices": [
            {
                "name": d.name,
                "description": d.description,
                "layers": d.layers,
                "memory_bytes": d.memory_bytes,
            }
            for d in devices
        ]
    }


def _kv_cache(generator: TextModel) -> dict[str, Any]:
    """`kv_cache` for /props where the engine knows its KV cache: types, tokens and bytes."""
    info = generator.kv_cache if isinstance(generator, ReportsKvCache) else None
    if info is None:
        return {}
    total = info.k_bytes + info.v_bytes
    return {
        "kv_cache": {
            "type_k": info.type_k,
            "type_v": info.type_v,
            "n_cells": info.cells,
            "k_bytes": info.k_bytes,
            "v_bytes": info.v_bytes,
            "bytes": total,
            "mib": round(total / 2**20, 2),
        }
    }


@dataclass
class NativeJob:
    """A /completion request ready to run: a generation per prompt, and what answers report."""

    generations: list[Generation]
    prompt_texts: list[str]
    request: NativeCompletionRequest


def prepare_native(
    model: LoadedModel,
    request: NativeCompletionRequest,
    n_predict: int,
    media: Sequence[SentMedia] = (),
) -> NativeJob:
    """Tokenize each prompt as the GGUF says (ids are taken as they are); resolve sampling. A
    prompt with media (`multimodal_data`, loaded by the route) is laid out in the model's
    worker, as a chat's is."""
    if isinstance(request.prompt, MultimodalPrompt):
        check_response_fields(request)
        text = request.prompt.prompt_string
        markers = text.count(LLAMA_MEDIA_MARKER)
        if media and markers != len(media):
            raise invalid_request(
                f"the prompt has {markers} media markers ({LLAMA_MEDIA_MARKER}) for "
                f"{len(media)} items of multimodal_data: one marker stands for each",
                "prompt",
            )
        engines = text.replace(LLAMA_MEDIA_MARKER, MEDIA_MARKER) if media else text
        prompt = laid_out(model, engines, media, "prompt")
        generations = prepare_choices(
            model, new_id("cmpl"), [prompt], request, request.token_limit(), n_predict
        )
        return NativeJob(generations, [text], request)
    generator = model.generator
    prompts = [tokenize_prompt(generator, prompt) for prompt in native_batch(request.prompt)]
    return native_job(model, request, prompts, n_predict)


def native_job(
    model: LoadedModel,
    request: NativeCompletionRequest,
    prompts: list[list[int]],
    n_predict: int,
) -> NativeJob:
    """A /completion-shaped job over prompt tokens (/completion's, /infill's)."""
    check_response_fields(request)
    if not prompts:
        raise invalid_request("the prompt is empty", "prompt")
    generations = prepare_choices(
        model, new_id("cmpl"), prompts, request, request.token_limit(), n_predict
    )
    texts = [detokenize_ids(model.generator, prompt) for prompt in prompts]
    return NativeJob(generations, texts, request)


def _stop_type(outcome: Outcome) -> str:
    if outcome.stop_reason == "word":
        return "word"
    return "limit" if outcome.finish_reason == "length" else "eos"


def _probabilities(tokens: Sequence[TokenLogprob], params: SamplingParams) -> list[Any]:
    """llama-server's completion_probabilities: each token's log-probability and its rivals',
    or with post_sampling_probs their probabilities after the sampler chain."""
    if params.post_sampling_probs:
        return post_sampling(tokens)

    def entry(token: int, piece: bytes, logprob: float) -> dict[str, Any]:
        text = piece.decode("utf-8", errors="replace")
        return {"id": token, "token": text, "bytes": list(piece), "logprob": logprob}

    return [
        {
            **entry(t.token, t.piece, t.logprob),
            "top_logprobs": [entry(token, piece, lp) for token, piece, lp in t.top],
        }
        for t in tokens
    ]


# The fields of a prompt's final /completion object (`_final`), which response_fields picks from.
ANSWER_FIELDS = frozenset(
    {
        "index", "content", "tokens", "id_slot", "stop", "model", "tokens_predicted",
        "tokens_evaluated", "generation_settings", "prompt", "has_new_line", "truncated",
        "stop_type", "stopping_word", "tokens_cached", "timings", "completion_probabilities",
    }
)  # fmt: skip


def _nothing_kept(wanted: Sequence[str]) -> APIError:
    return invalid_request(
        f"response_fields {list(wanted)} names no field of the answer, which would be empty; "
        f"its fields: {', '.join(sorted(ANSWER_FIELDS))} ('a/b' takes b out of a)",
        "response_fields",
    )


def check_response_fields(request: NativeCompletionRequest) -> None:
    """A 400 before any work when response_fields would keep nothing of the answer (llama-server
    answers {}): a name that is no field is dropped, as there, but not every name."""
    wanted = request.response_fields
    if wanted and not any(path.split("/")[0] in ANSWER_FIELDS for path in wanted):
        raise _nothing_kept(wanted)


def _fields(answer: dict[str, Any], wanted: Sequence[str]) -> dict[str, Any]:
    """llama-server's response_fields: only these, "a/b" taken out of a under its full name;
    never an empty object (a 400 when no path names anything here)."""
    kept: dict[str, Any] = {}
    for path in wanted:
        value: Any = answer
        for key in path.split("/"):
            if not isinstance(value, dict) or key not in value:
                break
            value = value[key]
        else:
            kept[path] = value
    if not kept:
        raise _nothing_kept(wanted)
    return kept


def _final(job: NativeJob, generation: Generation, outcome: Outcome) -> dict[str, Any]:
    """The object that ends one prompt's answer (`content` is empty when streaming)."""
    request = job.request
    prompt_n, predicted_n = outcome.prompt_tokens, outcome.completion_tokens
    model = generation.model
    answer: dict[str, Any] = {
        "index": generation.index,
        "content": "" if request.stream else outcome.text,
        "tokens": outcome.token_ids if request.return_tokens and not request.stream else [],
        "id_slot": outcome.slot,
        "stop": True,
        "model": model.name,
        "tokens_predicted": predicted_n,
        "tokens_evaluated": prompt_n,
        "generation_settings": generation_settings(
            generation.params, stream=request.stream, adapters=model.adapters
        ),
        "prompt": job.prompt_texts[generation.prompt_index],
        "has_new_line": "\n" in outcome.text,
        "truncated": prompt_n + predicted_n >= model.generator.n_ctx_seq,
        "stop_type": _stop_type(outcome),
        "stopping_word": outcome.stop_word or "",
        "tokens_cached": outcome.cached_tokens,
        "timings": timings_of(outcome),
    }
    if generation.params.logprobs is not None and not request.stream:
        answer["completion_probabilities"] = _probabilities(outcome.logprobs, generation.params)
    return _fields(answer, request.response_fields) if request.response_fields else answer


def _chunk(job: NativeJob, generation: Generation, event: TokenEvent) -> dict[str, Any]:
    """A streamed object with new text and its token ids."""
    chunk: dict[str, Any] = {
        "index": generation.index,
        "content": event.text,
        "tokens": list(event.token_ids),
        "stop": False,
        "id_slot": event.slot,
        "tokens_predicted": event.completion_tokens,
        "tokens_evaluated": event.prompt_tokens,
    }
    if event.progress is not None:
        chunk["prompt_progress"] = dataclasses.asdict(event.progress)
    if job.request.timings_per_token:
        chunk["timings"] = timings_of(event)
    if event.logprobs:
        chunk["completion_probabilities"] = _probabilities(event.logprobs, generation.params)
    return chunk


async def native_chunks(job: NativeJob) -> AsyncIterator[dict[str, Any]]:
    """Streamed /completion objects: text as it comes, then each prompt's final object."""
    texts: list[list[str]] = [[] for _ in job.generations]
    tokens: list[list[int]] = [[] for _ in job.generations]
    async for position, event in stream_all(job.generations):
        generation = job.generations[position]
        texts[position].append(event.text)
        tokens[position] += event.token_ids
        if event.text or event.token_ids or event.progress is not None:
            yield _chunk(job, generation, event)
        if event.finish_reason is not None:
            text = "".join(texts[position])
            yield _final(job, generation, finished(text, event, token_ids=tokens[position]))


async def native_completion(job: NativeJob) -> dict[str, Any] | list[dict[str, Any]]:
    """The whole /completion answer: one object, or one per prompt of a batch."""
    outcomes = await collect_all(job.generations)
    answers = [_final(job, g, o) for g, o in zip(job.generations, outcomes, strict=True)]
    return answers[0] if len(answers) == 1 else answers
