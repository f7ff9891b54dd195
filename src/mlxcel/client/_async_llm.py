"""The asyncio client."""

import asyncio
from collections.abc import AsyncIterator, Iterable, Mapping
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


class AsyncLLM(BaseLLM[openai.AsyncOpenAI]):
    """An asyncio client; a managed server is spawned at once and awaited on first use."""

    def _open(self) -> openai.AsyncOpenAI:
        return self._endpoint.async_openai_client()

    async def start(self) -> None:
        """Wait until a managed server is ready (`async with` and every request do this too)."""
        await asyncio.to_thread(self._wait_ready)

    async def _served_model(self) -> str:
        # Health polling and model discovery block, so they run off the event loop.
        return await asyncio.to_thread(self._model_id)

    async def generate(self, prompt: str, **sampling: Any) -> str:
        """Complete prompt (POST /v1/completions) and return the text."""
        request = completion_request(await self._served_model(), prompt, sampling)
        with self._api_errors():
            response = await self._client.completions.create(**request)
        return completion_text(response)

    async def chat(self, messages: Iterable[Mapping[str, Any]], **sampling: Any) -> str:
        """Answer a chat (POST /v1/chat/completions) and return the message content."""
        request = chat_request(await self._served_model(), messages, sampling)
        with self._api_errors():
            response = await self._client.chat.completions.create(**request)
        return chat_text(response)

    async def stream_generate(self, prompt: str, **sampling: Any) -> AsyncIterator[str]:
        """Complete prompt, yielding text deltas as they arrive."""
        request = completion_request(await self._served_model(), prompt, sampling)
        with self._api_errors():
            stream = await self._client.completions.create(stream=True, **request)
            async with stream:
                async for chunk in stream:
                    if text := completion_delta(chunk):
                        yield text

    async def stream_chat(
        self, messages: Iterable[Mapping[str, Any]], **sampling: Any
    ) -> AsyncIterator[str]:
        """Answer a chat, yielding content deltas as they arrive."""
        request = chat_request(await self._served_model(), messages, sampling)
        with self._api_errors():
            stream = await self._client.chat.completions.create(stream=True, **request)
            async with stream:
                async for chunk in stream:
                    if text := chat_delta(chunk):
                        yield text

    async def close(self) -> None:
        """Close the HTTP client and stop a managed server; safe to call twice."""
        await self._client.close()
        await asyncio.to_thread(self._stop_server)

    async def __aenter__(self) -> "AsyncLLM":
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()
