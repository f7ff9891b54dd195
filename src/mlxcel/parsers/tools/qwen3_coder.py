"""Qwen3-Coder's XML-style calls, and the grammar that forces them.

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    </function>
    </tool_call>

The template writes a string value as it is and anything else as JSON, each between newlines, so
the function's parameters schema says how to read a value back. A call starts once its
`<function=NAME>` is whole; its JSON arguments then grow by one key as each parameter closes.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable
from typing import Any

from llama_cpp.llama_grammar import SchemaConverter

from mlxcel.parsers.tools.base import Delta, Text, ToolArguments, ToolEnd, ToolStart
from mlxcel.parsers.tools.grammar import Tools, calls_rule, json_rules, literal, parameters
from mlxcel.parsers.tools.tagged import TaggedCallsParser

OPEN, CLOSE = "<tool_call>", "</tool_call>"
FUNCTION, FUNCTION_END = "<function=", "</function>"
PARAMETER, PARAMETER_END = "<parameter=", "</parameter>"
# A name runs to its ">"; a newline or "<" on the way means the text was not a tag after all.
_NOT_NAME = re.compile(r"[<\n]")
_OUTSIDE, _OPENED, _NAMING, _BODY, _AFTER = range(5)


class Qwen3CoderParser(TaggedCallsParser):
    """Content outside calls; a call starts at its function's name, its arguments grow per
    parameter, typed by the parameters schema of `tools`."""

    # Qwen3-Coder sometimes leaves out <tool_call>: a bare <function=...> is a call too.
    OPENINGS = (OPEN, FUNCTION)

    def __init__(self, tools: Tools | None = None) -> None:
        super().__init__()
        self._schemas = {
            t["function"]["name"]: t["function"].get("parameters") for t in tools or []
        }
        self._wrapped = False  # the call opened with <tool_call>, so </tool_call> closes it
        self._properties: dict[str, Any] = {}
        self._params = 0
        self._markup = ""  # the started call's text read so far

    def finish(self) -> list[Delta]:
        rest, state = self._buffer, self._state
        self._buffer, self._state = "", _OUTSIDE
        if state == _BODY:  # a started call the text ended inside: all of it is its markup
            self._markup += rest
            return [self._end(closed=False)]
        if state == _AFTER and CLOSE.startswith(rest.strip()):
            return []  # what came after the call was (the start of) its </tool_call>
        rest = (self._raw if state in (_OPENED, _NAMING) else "") + rest
        self._raw = ""
        return [Text(rest)] if rest else []

    def _end(self, *, closed: bool) -> ToolEnd:
        end = ToolEnd(self._calls - 1, self._markup, closed)
        self._markup = ""
        return end

    def _consume(self, rest: str) -> None:
        """Keep `rest`, the end of the buffer; what comes before it is the call's markup."""
        self._markup += self._buffer[: len(self._buffer) - len(rest)]
        self._buffer = rest

    def _step(self, deltas: list[Delta]) -> bool:
        steps = (self._outside, self._opened, self._naming, self._body, self._after)
        return steps[self._state](deltas)

    def _outside(self, deltas: list[Delta]) -> bool:
        marker = self._opening(deltas)
        if marker is None:
            return False
        self._wrapped = marker == OPEN
        self._state = _OPENED if self._wrapped else _NAMING
        return True

    def _opened(self, deltas: list[Delta]) -> bool:
        head = self._buffer.lstrip()
        if head.startswith(FUNCTION):
            return self._function(head)
        return False if FUNCTION.startswith(head) else self._not_a_call(deltas)

    def _naming(self, deltas: list[Delta]) -> bool:
        end = self._buffer.find(">")
        name = self._buffer if end < 0 else self._buffer[:end]
        if _NOT_NAME.search(name) or (end >= 0 and not name.strip()):
            return self._not_a_call(deltas)
        if end < 0:
            return False
        name = name.strip()
        self._calls += 1
        deltas.append(ToolStart(self._calls - 1, f"call_{uuid.uuid4().hex[:24]}", name))
        self._properties = (self._schemas.get(name) or {}).get("properties") or {}
        self._markup, self._raw, self._params = self._raw, "", 0
        self._consume(self._buffer[end + 1 :])
        self._state = _BODY
        return True

    def _body(self, deltas: list[Delta]) -> bool:
        head = self._buffer.lstrip()
        if head.startswith("{") and not self._params:
            return self._json_body(head, deltas)
        if head.startswith(PARAMETER):
            return self._parameter(head, deltas)
        if head.startswith(FUNCTION_END):
            deltas.append(ToolArguments(self._calls - 1, "}" if self._params else "{}"))
            self._consume(head[len(FUNCTION_END) :])
            deltas.append(self._end(closed=True))
            self._state = _AFTER if self._wrapped else _OUTSIDE
            return True
        if PARAMETER.startswith(head) or FUNCTION_END.startswith(head):
            return False
        return self._unclosed(deltas)

    def _json_body(self, head: str, deltas: list[Delta]) -> bool:
        """Functionary v3.1's (and Llama 3.1's custom) shape: `<function=NAME>{json}</function>`."""
        end = head.find(FUNCTION_END)
        if end < 0:
            return False
        try:
            arguments = json.loads(head[:end])
        except ValueError:
            return self._unclosed(deltas)
        if not isinstance(arguments, dict):
            return self._unclosed(deltas)
        deltas.append(ToolArguments(self._calls - 1, json.dumps(arguments, ensure_ascii=False)))
        self._consume(head[end + len(FUNCTION_END) :])
        deltas.append(self._end(closed=True))
        self._state = _AFTER if self._wrapped else _OUTSIDE
        return True

    def _unclosed(self, deltas: list[Delta]) -> bool:
        """Not markup: the call ends unclosed, and the text from here on is content."""
        deltas.append(self._end(closed=False))
        self._state = _OUTSIDE
        return True

    def _parameter(self, head: str, deltas: list[Delta]) -> bool:
        close = head.find(">", len(PARAMETER))
        name = head[len(PARAMETER) : close if close >= 0 else None]
        if _NOT_NAME.search(name) or (close >= 0 and not name.strip()):
            return self._unclosed(deltas)
        if close < 0:
            return False
        # A value ends at its </parameter>, or at the next tag when the model left that out.
        ends = [
            at for m in (PARAMETER_END, PARAMETER, FUNCTION_END) if (at := head.find(m, close)) >= 0
        ]
        if not ends:
            return False
        value = head[close + 1 : min(ends)]
        value = value[1:] if value.startswith("\n") else value
        value = value[:-1] if value.endswith("\n") else value
        rest = head[min(ends) :]
        self._consume(rest[len(PARAMETER_END) :] if rest.startswith(PARAMETER_END) else rest)
        name = name.strip()
        typed = convert(value, self._properties.get(name))
        pair = f"{json.dumps(name, ensure_ascii=False)}: {json.dumps(typed, ensure_ascii=False)}"
        deltas.append(ToolArguments(self._calls - 1, (", " if self._params else "{") + pair))
        self._params += 1
        return True

    def _after(self, deltas: list[Delta]) -> bool:
        head = self._buffer.lstrip()
        if head.startswith(CLOSE):
            self._buffer, self._state = head[len(CLOSE) :], _OUTSIDE
            return True
        if head.startswith(FUNCTION):  # another function inside the same <tool_call>
            return self._function(head)
        if CLOSE.startswith(head) or FUNCTION.startswith(head):
            return False
        self._state = _OUTSIDE  # no </tool_call>: what follows is content
        return True

    def _function(self, head: str) -> bool:
        """Read <function= (and the whitespace before it) as part of a call still to start."""
        self._raw += self._buffer[: len(self._buffer) - len(head) + len(FUNCTION)]
        self._buffer, self._state = head[len(FUNCTION) :], _NAMING
        return True


def schema_types(schema: dict[str, Any]) -> set[str]:
    """The JSON types `schema` allows by its type, enum, const or anyOf/oneOf; empty: any."""
    kind = schema.get("type")
    if isinstance(kind, str):
        return {kind}
    if isinstance(kind, list):
        return {str(k) for k in kind}
    if "enum" in schema or "const" in schema:
        values = schema["enum"] if "enum" in schema else [schema["const"]]
        return {_json_type(v) for v in values}
    branches = [schema_types(b) for b in schema.get("anyOf") or schema.get("oneOf") or []]
    return set().union(*branches) if all(branches) else set()


def convert(raw: str, schema: dict[str, Any] | None) -> Any:
    """A parameter's raw text as the JSON value `schema` describes; a string when it says so,
    or when the text is not JSON."""
    types = schema_types(schema) if schema is not None else set()
    if types == {"string"}:
        return raw
    try:
        value = json.loads(raw, parse_constant=_not_json)
    except ValueError:
        return raw
    kind = _json_type(value)
    fits = not types or kind in types or (kind == "integer" and "number" in types)
    return value if fits or "string" not in types else raw


def _not_json(constant: str) -> None:
    raise ValueError(f"{constant} is not JSON")


def _json_type(value: Any) -> str:
    for kind, python in (("boolean", bool), ("integer", int), ("number", float), ("string", str)):
        if isinstance(value, python):
            return kind
    return "null" if value is None else "array" if isinstance(value, list) else "object"


# Raw text that never holds "</", so a value cannot run past its </parameter>.
RAW_TEXT = '([^<] | "<"+ [^/<])* "<"*'
_CALL_OPEN, _CALL_CLOSE = literal(OPEN + "\n"), literal(FUNCTION_END + "\n" + CLOSE)
_VALUE_CLOSE = literal("\n" + PARAMETER_END + "\n")


def forced_grammar(tools: Tools, parallel: bool) -> str:
    """GBNF for calls to `tools` in this format; each required parameter must appear."""
    converter = json_rules()
    separator = "\n" if parallel else None
    rules = [f"root ::= {calls_rule('fc-call', '', separator, '')}"]
    for i, tool in enumerate(tools):
        parts = [literal(FUNCTION + tool["function"]["name"] + ">\n")]
        parts += parameter_rules(converter, tool, i, lambda n: f"{PARAMETER}{n}>\n", _VALUE_CLOSE)
        rules.append(f"fc-function-{i} ::= {' '.join(parts)}")
    functions = " | ".join(f"fc-function-{i}" for i in range(len(tools)))
    rules.append(f"fc-call ::= {_CALL_OPEN} ({functions}) {_CALL_CLOSE}")
    rules.append(f"fc-text ::= {RAW_TEXT}")
    return "\n".join([*rules, converter.format_grammar()])


def parameter_rules(
    converter: SchemaConverter,
    tool: dict[str, Any],
    index: int,
    opening: Callable[[str], str],
    closing: str,
) -> list[str]:
    """Each parameter of `tool` as `opening(name)` (text), its value, then `closing` (a GBNF
    literal); optional unless the schema requires it."""
    schema = parameters(converter, tool, index)
    required = schema.get("required") or []
    properties = schema.get("properties") or {}
    properties = {**properties, **{n: {} for n in required if n not in properties}}
    parts = []
    for j, (name, value_schema) in enumerate(properties.items()):
        value = value_rule(converter, value_schema, f"arg-{index}-{j}")
        parameter = f"{literal(opening(name))} {value} {closing}"
        parts.append(parameter if name in required else f"({parameter})?")
    return parts


def value_rule(converter: SchemaConverter, schema: dict[str, Any], name: str) -> str:
    """A parameter's value: raw text for a string, JSON (by llama.cpp's converter) otherwise."""
    if schema_types(schema) != {"string"}:
        rule: str = converter.visit(schema, name)
        return rule
    choices = (
        schema["enum"] if "enum" in schema else [schema["const"]] if "const" in schema else None
    )
    if choices is not None:
        return "(" + " | ".join(literal(str(c)) for c in choices) + ")"
    if "minLength" in schema or "maxLength" in schema:
        return f"[^<]{{{schema.get('minLength', 0)},{schema.get('maxLength', '')}}}"
    return "fc-text"
