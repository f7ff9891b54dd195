"""Reasoning parsers: split a model's thinking from its answer, behind a registry by name."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from mlxcel.parsers.reasoning.gemma import GemmaParser
from mlxcel.parsers.reasoning.think import ThinkParser


class ReasoningParser(Protocol):
    """A streaming state machine: text in, (reasoning, content) out."""

    def feed(self, text: str) -> tuple[str, str]:
        """Reasoning and content that `text` completes; a marker in progress is held back."""
        ...

    def finish(self) -> tuple[str, str]:
        """Whatever is held back at the end."""
        ...


PARSERS: dict[str, Callable[[], ReasoningParser]] = {
    # DeepSeek-R1's template opens <think> itself, so output starts inside the thinking.
    "deepseek_r1": lambda: ThinkParser(start_inside=True),
    # Qwen3 writes its own <think>...</think> (or nothing, with thinking off).
    "qwen3": lambda: ThinkParser(start_inside=False),
    # Gemma 4 writes <|channel>thought\n...<channel|>.
    "gemma": GemmaParser,
}


def reasoning_parser_name(setting: str, prompt_text: str, template_source: str) -> str | None:
    """The parser for this request: the server's choice, or with 'auto' the template's tags."""
    if setting == "none":
        return None
    if setting != "auto":
        return setting
    if "<|channel|>" in template_source:
        return "harmony"  # gpt-oss: one parser reads channels and calls (serving/answer.py)
    if "<|channel>" in template_source:
        return "gemma"
    if "<think>" not in template_source:
        return None
    # A template that opens <think> for the model (DeepSeek-R1 style) starts it inside.
    return "deepseek_r1" if prompt_text.rstrip().endswith("<think>") else "qwen3"


__all__ = ["PARSERS", "GemmaParser", "ReasoningParser", "ThinkParser", "reasoning_parser_name"]
