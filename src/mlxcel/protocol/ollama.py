"""Request bodies of Ollama's API (/api/chat, /api/generate, /api/embed, /api/show, ...).

Every field Ollama's docs/api.md and its Python client define is declared: honoured, or marked
`NoEffect`/`Refused` as on every route (protocol/policy.py); any other field is a 400 naming it.
`options` maps onto the sampling fields every text route honours (serving/ollama_input.py).
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field

from mlxcel.protocol.chat import ToolDef
from mlxcel.protocol.policy import NoEffect, Refused, Strict

_AT_LOAD = NoEffect(
    "set when the model loads, by the server's flags (--ctx-size, --threads, --batch-size, "
    "--mmap, --mlock, --n-gpu-layers): a request cannot change them"
)

# Go's time.ParseDuration units, which Ollama's keep_alive strings use ("5m", "1h30m").
_GO_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_GO_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")


def keep_alive_seconds(value: Any) -> Any:
    """Ollama's keep_alive as seconds: a number is seconds, a string a Go duration ("5m") or
    a number; a negative one means forever (math.inf)."""
    if value is None:
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str):
        seconds = _go_duration(value.strip())
    else:
        raise ValueError("expected seconds or a duration such as '5m', '1h30m', '0' or '-1'")
    return math.inf if seconds < 0 else seconds


def _go_duration(text: str) -> float:
    sign = -1.0 if text.startswith("-") else 1.0
    body = text.lstrip("+-")
    try:
        return sign * float(body)
    except ValueError:
        pass
    parts = _GO_PART.findall(body)
    if not body or "".join(number + unit for number, unit in parts) != body:
        raise ValueError(f"expected a duration such as '5m', '1h30m', '0' or '-1', got {text!r}")
    return sign * sum(float(number) * _GO_UNITS[unit] for number, unit in parts)


KeepAlive = Annotated[float | None, BeforeValidator(keep_alive_seconds)]
"""Seconds the model stays loaded after the request (math.inf: forever; None: the default)."""


class Options(Strict):
    """Ollama's `options`: the runtime ones honoured, the load-time ones accepted."""

    num_predict: int | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    typical_p: float | None = None
    seed: int | None = None
    stop: list[str] | None = None
    repeat_penalty: float | None = None
    repeat_last_n: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    mirostat: int | None = None
    mirostat_tau: float | None = None
    mirostat_eta: float | None = None
    num_keep: Annotated[
        int | None,
        NoEffect("the context is never shifted here (a prompt past it is refused), so no "
                 "tokens need keeping"),
    ] = None  # fmt: skip
    tfs_z: Annotated[
        float | None, NoEffect("tail-free sampling left llama.cpp; 1.0 (off) is all it can be")
    ] = None
    penalize_newline: Annotated[
        bool | None, NoEffect("llama.cpp dropped it; newlines are penalised as any token is")
    ] = None
    num_ctx: Annotated[int | None, _AT_LOAD] = None
    num_batch: Annotated[int | None, _AT_LOAD] = None
    num_gpu: Annotated[int | None, _AT_LOAD] = None
    main_gpu: Annotated[int | None, _AT_LOAD] = None
    num_thread: Annotated[int | None, _AT_LOAD] = None
    numa: Annotated[bool | None, _AT_LOAD] = None
    low_vram: Annotated[bool | None, _AT_LOAD] = None
    f16_kv: Annotated[bool | None, _AT_LOAD] = None
    logits_all: Annotated[bool | None, _AT_LOAD] = None
    vocab_only: Annotated[bool | None, _AT_LOAD] = None
    use_mmap: Annotated[bool | None, _AT_LOAD] = None
    use_mlock: Annotated[bool | None, _AT_LOAD] = None
    embedding_only: Annotated[bool | None, _AT_LOAD] = None


class CalledFunction(Strict):
    index: int | None = None
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)


class ToolCall(Strict):
    id: str | None = None
    type: Literal["function"] | None = None
    function: CalledFunction


class Message(Strict):
    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    thinking: str | None = None
    images: list[str] | None = None
    """Base64 images (the client reads files and bytes into base64 before sending)."""
    tool_calls: list[ToolCall] | None = None
    tool_name: str | None = None
    tool_call_id: str | None = None


Format = Literal["", "json"] | dict[str, Any] | None
Think = bool | Literal["low", "medium", "high"] | None
_NO_LOGPROBS = Refused(
    "log-probabilities are served on /v1/chat/completions and /v1/completions (logprobs), "
    "not on Ollama's routes",
    accepts=lambda value: not value,
)


class GenerationFields(Strict):
    """What /api/chat and /api/generate share."""

    model: str = Field(min_length=1)
    stream: bool = True
    format: Format = None
    options: Options | None = None
    keep_alive: KeepAlive = None
    think: Think = None
    logprobs: Annotated[bool | None, _NO_LOGPROBS] = None
    top_logprobs: Annotated[int | None, _NO_LOGPROBS] = None
    truncate: Annotated[
        bool | None,
        NoEffect("a prompt past the context is refused with a 400, never cut"),
    ] = None
    shift: Annotated[
        bool | None,
        NoEffect("the context is never shifted: an answer stops at its end (done_reason length)"),
    ] = None


class ChatRequest(GenerationFields):
    """POST /api/chat."""

    messages: list[Message] = Field(default_factory=list)
    tools: list[ToolDef] | None = None


_IMAGE_GENERATION = Refused(
    "images are drawn on /v1/images/generations, by an --image-model", accepts=lambda v: v is None
)


class GenerateRequest(GenerationFields):
    """POST /api/generate."""

    prompt: str | None = None
    suffix: str | None = None
    system: str | None = None
    template: Annotated[
        str | None,
        Refused(
            "Go templates are not run here: the model's own chat template renders the prompt "
            "(or send raw: true with the prompt already templated)",
            accepts=lambda value: not value,
        ),
    ] = None
    context: list[int] | None = None
    raw: bool = False
    images: list[str] | None = None
    width: Annotated[int | None, _IMAGE_GENERATION] = None
    height: Annotated[int | None, _IMAGE_GENERATION] = None
    steps: Annotated[int | None, _IMAGE_GENERATION] = None


class EmbedRequest(Strict):
    """POST /api/embed."""

    model: str = Field(min_length=1)
    input: str | list[str]
    truncate: bool = True
    dimensions: int | None = Field(default=None, ge=1)
    options: Options | None = None
    keep_alive: KeepAlive = None


class EmbeddingsRequest(Strict):
    """POST /api/embeddings, the older route: one prompt, one vector."""

    model: str = Field(min_length=1)
    prompt: str = ""
    options: Options | None = None
    keep_alive: KeepAlive = None


class ShowRequest(Strict):
    """POST /api/show; older clients send `name`."""

    model: str | None = None
    name: str | None = None
    verbose: bool = False


class PullRequest(Strict):
    """POST /api/pull: a Hugging Face repo, as Ollama names one (hf.co/ORG/NAME:QUANT)."""

    model: str | None = None
    name: str | None = None
    insecure: bool = False
    stream: bool = True


class DeleteRequest(Strict):
    """DELETE /api/delete."""

    model: str | None = None
    name: str | None = None
