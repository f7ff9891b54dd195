"""Reasoning parsers: split a model's thinking from its answer, behind a registry by name."""

from __future__ import annotations

from collections.abc import Callable

from mlxcel.parsers.reasoning.think import ThinkParser

PARSERS: dict[str, Callable[[], ThinkParser]] = {
    # DeepSeek-R1's template opens <think> itself, so output starts inside the thinking.
    "deepseek_r1": lambda: ThinkParser(start_inside=True),
    # Qwen3 writes its own <think>...</think> (or nothing, with thinking off).
    "qwen3": lambda: ThinkParser(start_inside=False),
}

__all__ = ["PARSERS", "ThinkParser"]
