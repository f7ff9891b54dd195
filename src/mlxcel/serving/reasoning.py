"""Which reasoning parser a chat request uses, and the split of thinking from the answer."""

from __future__ import annotations

from mlxcel.engine.types import TextModel


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
