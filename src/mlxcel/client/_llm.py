"""The blocking client."""

from collections.abc import Iterable, Iterator, Mapping
from types import TracebackType
from typing import Any

import openai

from mlxcel.client._base import BaseLLM
from mlxcel.client._requests import (
    chat_delta,
    chat_request,
    chat_text,
    completion_delta,
    completion_request,
    completion_text,
)


class LLM(BaseLLM[openai.OpenAI]):
    """A blocking client; in managed mode the constructor returns once the server is ready."""

    def _open(self) -> openai.OpenAI:
        self._wait_ready()
        return self._endpoint.openai_client()

    def generate(self, prompt: str, **sampling: Any) -> str:
        """Complete prompt (POST /v1/completions) and return the text."""
        with self._api_errors():
            response = self._client.completions.create(
                **completion_request(self.model, prompt, sampling)
            )
        return completion_text(response)

    def chat(self, messages: Iterable[Mapping[str, Any]], **sampling: Any) -> str:
        """Answer a chat (POST /v1/chat/completions) and return the message content."""
        with self._api_errors():
            response = self._client.chat.completions.create(
                **chat_request(self.model, messages, sampling)
            )
        return chat_text(response)

    def stream_generate(self, prompt: str, **sampling: Any) -> Iterator[str]:
        """Complete prompt, yielding text deltas as they arrive."""
        request = completion_request(self.model, prompt, sampling)
        with self._api_errors(), self._client.completions.create(stream=True, **request) as stream:
            for chunk in stream:
                if text := completion_delta(chunk):
                    yield text

    def stream_chat(self, messages: Iterable[Mapping[str, Any]], **sampling: Any) -> Iterator[str]:
        """Answer a chat, yielding content deltas as they arrive."""
        request = chat_request(self.model, messages, sampling)
        with (
            self._api_errors(),
            self._client.chat.completions.create(stream=True, **request) as stream,
        ):
            for chunk in stream:
                if text := chat_delta(chunk):
                    yield text

    def close(self) -> None:
        """Close the HTTP client and stop a managed server; safe to call twice."""
        self._client.close()
        self._stop_server()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
