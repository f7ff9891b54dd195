"""Which reasoning parser a chat request uses, and the split of thinking from the answer."""

from __future__ import annotations

from mlxcel.engine.types import TextModel


def thinking_kwargs(effort: str | None) -> dict[str, object]:
    """Template variables for a reasoning effort: gpt-oss style templates read
    `reasoning_effort`, Qwen3 style ones `enable_thinking` (off for effort 'none')."""
    if effort is None:
        return {}
    return {"reasoning_effort": effort, **({"enable_thinking": False} if effort == "none" else {})}


def reasoning_tokens(generator: TextModel, reasoning: str, output_tokens: int) -> int:
    """Output tokens spent thinking: the reasoning text retokenized, at most the output."""
    if not reasoning:
        return 0
    return min(
        output_tokens, len(generator.tokenize(reasoning, add_special=False, parse_special=False))
    )
