"""Python client for an mlxcel server: spawned and supervised (managed) or already running."""

from mlxcel.client._async_llm import AsyncLLM
from mlxcel.client._llm import LLM

__all__ = ["LLM", "AsyncLLM"]
