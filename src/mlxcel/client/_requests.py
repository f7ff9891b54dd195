"""Building completion requests from keyword arguments, and translating SDK errors."""

from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import openai
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from mlxcel.errors import APIConnectionError, APIError, status_error

_COMMON_FIELDS = frozenset(
    {
        "frequency_penalty",
        "logit_bias",
        "logprobs",
        "max_tokens",
        "n",
        "presence_penalty",
        "seed",
        "stop",
        "stream_options",
        "temperature",
        "top_p",
        "user",
    }
)
# Options of the SDK's create() that shape the HTTP call rather than the body.
_REQUEST_OPTIONS = frozenset({"extra_headers", "extra_query", "timeout"})
COMPLETION_FIELDS = _COMMON_FIELDS | {"best_of", "echo", "suffix"}
CHAT_FIELDS = _COMMON_FIELDS | {
    "max_completion_tokens",
    "top_logprobs",
    "response_format",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "reasoning_effort",
    "metadata",
    "modalities",
    "audio",
    "prediction",
    "service_tier",
    "store",
    "functions",
    "function_call",
    "web_search_options",
    "verbosity",
}
_RESERVED = frozenset({"model", "prompt", "messages", "stream"})


def split_sampling(sampling: Mapping[str, Any], fields: frozenset[str]) -> dict[str, Any]:
    """Return create() keyword arguments: known fields top-level, the rest in extra_body."""
    reserved = sorted(_RESERVED & sampling.keys())
    if reserved:
        raise TypeError(f"these arguments are set by the client itself: {', '.join(reserved)}")
    kwargs: dict[str, Any] = {}
    extra_body: dict[str, Any] = {}
    for name, value in sampling.items():
        if value is None or name == "extra_body":
            continue
        if name in fields or name in _REQUEST_OPTIONS:
            kwargs[name] = value
        else:
            extra_body[name] = value
    # An explicit extra_body is the caller's last word on the request body.
    extra_body.update(sampling.get("extra_body") or {})
    if extra_body:
        kwargs["extra_body"] = extra_body
    return kwargs


def _single_choice(sampling: Mapping[str, Any]) -> None:
    if sampling.get("n", 1) not in (None, 1):
        raise ValueError("the text helpers return one choice; use openai_client for n > 1")


def completion_request(model: str, prompt: str, sampling: Mapping[str, Any]) -> dict[str, Any]:
    """Return the create() arguments of a text completion."""
    _single_choice(sampling)
    return {"model": model, "prompt": prompt, **split_sampling(sampling, COMPLETION_FIELDS)}


def chat_request(
    model: str, messages: Iterable[Mapping[str, Any]], sampling: Mapping[str, Any]
) -> dict[str, Any]:
    """Return the create() arguments of a chat completion."""
    _single_choice(sampling)
    return {"model": model, "messages": list(messages), **split_sampling(sampling, CHAT_FIELDS)}


def completion_text(response: Completion) -> str:
    """Return the text of a completion's first choice."""
    return response.choices[0].text


def chat_text(response: ChatCompletion) -> str:
    """Return the message content of a chat completion's first choice."""
    return response.choices[0].message.content or ""


def completion_delta(chunk: Completion) -> str:
    """Return the new text in a streamed completion chunk ("" for usage-only chunks)."""
    return chunk.choices[0].text if chunk.choices else ""


def chat_delta(chunk: ChatCompletionChunk) -> str:
    """Return the new content in a streamed chat chunk ("" for role or usage chunks)."""
    return (chunk.choices[0].delta.content or "") if chunk.choices else ""


@contextmanager
def api_errors(unreachable: Callable[[BaseException], APIConnectionError]) -> Iterator[None]:
    """Re-raise openai SDK errors as mlxcel errors, keeping the original as the cause;
    `unreachable` turns a connection failure into an error that names the server."""
    try:
        yield
    except openai.APIStatusError as exc:
        raise status_error(exc.status_code, exc.body) from exc
    except openai.APIConnectionError as exc:
        # The SDK says only "Connection error."; the transport's own error says why.
        raise unreachable(exc.__cause__ or exc) from exc
    except openai.APIError as exc:
        # An error event in the middle of a stream: the HTTP status was already 200.
        raise APIError(exc.message, error_type=exc.type, param=exc.param, code=exc.code) from exc
