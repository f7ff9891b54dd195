"""Function tools on chat: what the template sees, the grammar that forces a call, the parse."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

import llguidance

from mlxcel.engine.markers import as_text, with_markers
from mlxcel.engine.types import ChatTemplate
from mlxcel.parsers.tools import (
    CALL_ENDS,
    CALL_EXAMPLES,
    CALL_GRAMMARS,
    DEFAULT_PARSER,
    PARSERS,
    ForcedGrammar,
    Reasoning,
    Text,
    ToolArguments,
    ToolStart,
    WholeCalls,
    detect_parser,
)
from mlxcel.protocol.errors import invalid_request
from mlxcel.serving.chat_template import CHATML
from mlxcel.serving.structured import checked_schema
from mlxcel.serving.text import Generation


def _tools_preamble(parser: str) -> str:
    return (
        f"You can call functions. To call one, answer with {CALL_EXAMPLES[parser]}. "
        "Available functions:\n"
    )


@dataclass(frozen=True)
class ToolPlan:
    """How one chat request uses its tools: shown to the model, forced, and parsed."""

    tools: list[dict[str, Any]]
    parser: str
    grammar: ForcedGrammar | None
    parallel: bool = True
    """False: one call at most (`parallel_tool_calls: false`), and the answer ends with it."""


def tool_calls_as_text(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Assistant tool calls as JSON text, for a template that knows no tool calls."""

    def text(message: dict[str, Any]) -> dict[str, Any]:
        calls = [call["function"] for call in message.get("tool_calls") or []]
        if not calls:
            return message
        return {"role": "assistant", "content": json.dumps({"tool_calls": calls})}

    return [text(message) for message in messages]


def template_messages(
    template: ChatTemplate | None,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]],
    parser: str = DEFAULT_PARSER,
) -> list[dict[str, Any]]:
    """Messages a template can render; tools go in a system message, calls shown in `parser`'s
    format, if it cannot show them."""
    source = template.source if template else CHATML
    if "tool_calls" not in source:
        messages = tool_calls_as_text(messages)
    if tools and "tools" not in source:
        listing = "\n".join(json.dumps(tool["function"]) for tool in tools)
        if messages and messages[0]["role"] == "system":
            first = messages[0]
            content = f"{first['content']}\n\n{_tools_preamble(parser)}{listing}"
            messages = [{**first, "content": content}, *messages[1:]]
        else:
            preamble = {"role": "system", "content": _tools_preamble(parser) + listing}
            messages = [preamble, *messages]
    return messages


def forced_call_grammar(tools: list[dict[str, Any]], parallel: bool, parser: str) -> ForcedGrammar:
    """The grammar for one (or, with `parallel`, several) calls to `tools`, as `parser` reads."""
    try:
        grammar = CALL_GRAMMARS[parser](tools, parallel)
    except Exception as exc:  # the converter raises plain errors on schema features it lacks
        raise invalid_request(f"cannot constrain to these tool parameters: {exc}", "tools") from exc
    if grammar.syntax == "lark":
        text = with_markers(grammar.text, grammar.markers, as_text)
        error = llguidance.LLMatcher.validate_grammar(llguidance.grammar_from("lark", text))
        if error:
            raise invalid_request(f"cannot constrain to these tool parameters: {error}", "tools")
    return grammar


def with_tools(generation: Generation, plan: ToolPlan | None, format_field: str) -> Generation:
    """`generation` under the plan's forcing grammar, if it has one (a request that also
    constrains its output, `format_field`, a schema or a grammar, is a 400); without one and
    without parallel calls, stopping at the end of the first call where the format marks it."""
    if plan is None:
        return generation
    params = generation.params
    if plan.grammar is None:
        end = CALL_ENDS.get(plan.parser)
        if plan.parallel or end is None:
            return generation
        return replace(generation, params=replace(params, stop=(*params.stop, end)))
    if params.grammar or params.json_schema:
        raise invalid_request(
            f"a forced tool call cannot be combined with {format_field}, json_schema or grammar",
            "tool_choice",
        )
    return replace(generation, params=plan.grammar.applied(params), constraint_param="tools")


def plan_tools(
    tools: list[dict[str, Any]],
    choice: Any,
    parallel: bool,
    parser: str,
    template_source: str | None,
) -> ToolPlan | None:
    """None when the request has no tools to use (none given, or tool_choice 'none')."""
    if parser == "auto":
        parser = detect_parser(template_source)
    if not tools and choice not in (None, "none", "auto"):
        raise invalid_request("tool_choice requires tools", "tool_choice")
    for index, tool in enumerate(tools):
        parameters = tool["function"].get("parameters")
        if parameters is not None:
            checked_schema(parameters, f"tools.{index}.function.parameters")
    if not tools or choice == "none":
        return None
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name")
        chosen = [t for t in tools if t["function"]["name"] == name]
        if not chosen:
            raise invalid_request(
                f"tool_choice names '{name}', which is not in tools", "tool_choice"
            )
        return ToolPlan(tools, parser, forced_call_grammar(chosen, False, parser), False)
    if choice == "required":
        return ToolPlan(tools, parser, forced_call_grammar(tools, parallel, parser), parallel)
    return ToolPlan(tools, parser, None, parallel)


class ToolStream:
    """One choice's output split into content and OpenAI tool-call deltas as it streams.

    `tools` are the request's: a format whose values are raw text types them by their schema.
    Without `parallel`, calls after the first are dropped.
    Each call goes out once it has ended (see WholeCalls), so none is sent broken.
    Whitespace around a call (the newline between two) is not content: trailing whitespace is
    held until more text or the end follows, and dropped when a call does, as is whitespace
    that opens the text after a call.
    """

    def __init__(
        self, parser: str, tools: list[dict[str, Any]] | None = None, parallel: bool = True
    ) -> None:
        self._parser = WholeCalls(PARSERS[parser](tools), None if parallel else 1)
        self._space = ""
        self._after_call = False

    @property
    def calls(self) -> int:
        """Tool calls sent so far."""
        return self._parser.calls

    def feed(self, text: str) -> list[dict[str, Any]]:
        """Chat deltas for new text."""
        return self._deltas(self._parser.feed(text))

    def finish(self, truncated: bool = False) -> list[dict[str, Any]]:
        """Chat deltas for what was held back; `truncated`: max_tokens cut the text off."""
        out = self._deltas(self._parser.finish(truncated))
        if self._space:
            out.append({"content": self._space})
        self._space = ""
        return out

    def _deltas(self, deltas: list[Any]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for delta in deltas:
            if isinstance(delta, Text):
                text = self._space + delta.text
                if self._after_call:
                    text = text.lstrip()
                body = text.rstrip()
                self._space = text[len(body) :]
                if body:
                    self._after_call = False
                    out.append({"content": body})
            elif isinstance(delta, ToolStart):
                self._space = ""
                self._after_call = True
                function = {"name": delta.name, "arguments": ""}
                call = {"index": delta.index, "id": delta.id, "type": "function"}
                out.append({"tool_calls": [{**call, "function": function}]})
            elif isinstance(delta, ToolArguments):
                fragment = {"index": delta.index, "function": {"arguments": delta.fragment}}
                out.append({"tool_calls": [fragment]})
            elif isinstance(delta, Reasoning):
                out.append({"reasoning_content": delta.text})
        return out
