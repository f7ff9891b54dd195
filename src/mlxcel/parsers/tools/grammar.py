"""Grammars that force tool calls, written in the shape the format's parser reads.

JSON-shaped calls are llguidance lark with the call's schema inline, so the parameters schema
holds whole. Formats with their own markup write GBNF: their JSON values come from llama.cpp's
schema converter, whose rules take the names given to `visit` (the XML-like formats pass
`arg-...`), the names of the $defs they use, and its primitives' (`string`, `space`, ...).
Rules written by hand are named `root` and `fc-...` to stay apart.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from llama_cpp.llama_grammar import SchemaConverter

from mlxcel.engine.markers import spelled
from mlxcel.engine.types import GrammarSyntax, SamplingParams
from mlxcel.parsers.schemas import closed_objects

Tools = list[dict[str, Any]]


@dataclass(frozen=True)
class ForcedGrammar:
    """A grammar that forces calls, its syntax, `gbnf` or `lark` (llguidance's), and its
    markers: rules a lark grammar names, text a GBNF grammar holds (engine/markers.py)."""

    text: str
    syntax: GrammarSyntax
    markers: tuple[str, ...] = ()

    def applied(self, params: SamplingParams) -> SamplingParams:
        """`params` generating under this grammar."""
        return replace(
            params, grammar=self.text, grammar_syntax=self.syntax, grammar_markers=self.markers
        )


# Builds the grammar for calls to `tools`; several of them in a row when the bool says so.
CallGrammar = Callable[[Tools, bool], ForcedGrammar]


def gbnf(builder: Callable[[Tools, bool], str], markers: tuple[str, ...] = ()) -> CallGrammar:
    """A builder of GBNF text as a CallGrammar: llama.cpp's grammar sampler matches `markers`
    (special tokens where the vocabulary has them) by their text; llguidance as the tokens
    they are (engine/markers.py)."""

    def grammar(tools: Tools, parallel: bool) -> ForcedGrammar:
        return ForcedGrammar(builder(tools, parallel), "gbnf", markers)

    return grammar


_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def literal(text: str) -> str:
    """`text` as a GBNF string literal."""
    escaped = (_ESCAPES.get(c, c if c >= " " else f"\\x{ord(c):02x}") for c in text)
    return '"' + "".join(escaped) + '"'


def calls_rule(call: str, opening: str, separator: str | None, closing: str) -> str:
    """Rule `call` once, or with `separator` between several, inside `opening` and `closing`."""
    parts = [literal(opening), call]
    if separator is not None:
        parts.append(f"({literal(separator)} {call})*")
    parts.append(literal(closing))
    return " ".join(p for p in parts if p != '""')


def json_rules() -> SchemaConverter:
    """llama.cpp's JSON-schema-to-GBNF converter; one per grammar so shared rules appear once."""
    return SchemaConverter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)


def parameters(converter: SchemaConverter, tool: dict[str, Any], index: int) -> dict[str, Any]:
    """The tool's parameters schema with its local $refs known to `converter`.

    A copy: resolving rewrites the $refs, and the request's own schema also goes to the template.
    """
    schema = copy.deepcopy(tool["function"].get("parameters") or {"type": "object"})
    resolved: dict[str, Any] = converter.resolve_refs(schema, f"tool{index}")
    return resolved


def json_call_grammar(
    arguments_key: str,
    opening: str,
    separator: str | None,
    closing: str,
    markers: tuple[str, ...] = (),
) -> CallGrammar:
    """Calls as JSON objects {"name", `arguments_key`} inside `opening` and `closing`.

    `separator` goes between parallel calls; None allows one call only. The grammar is
    llguidance's lark with the call schema inline (`%json`), so every JSON Schema keyword of the
    parameters holds (bounds, lengths, patterns), as it does for response_format. `markers`
    in the three texts are written as the special tokens they may be (engine/markers.py).
    """

    def grammar(tools: Tools, parallel: bool) -> ForcedGrammar:
        schemas = [_call_schema(tool, arguments_key) for tool in tools]
        schema = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
        schema = {**schema, **_COMPACT}
        parts = [spelled(opening, markers), "call"]
        if parallel and separator is not None:
            parts.append(f"({spelled(separator, markers)} call)*")
        parts.append(spelled(closing, markers))
        if parallel and separator is not None and separator.startswith("\n"):
            # What separates two calls may begin after the last: a model that writes the
            # newline may still end there rather than be held to another call.
            parts.append('"\\n"?')
        start = " ".join(part for part in parts if part)
        text = f"start: {start}\ncall: %json {json.dumps(schema)}\n"
        return ForcedGrammar(text, "lark", markers)

    return grammar


# At most one space between JSON tokens, as for response_format.
_COMPACT = {"x-guidance": {"whitespace_pattern": " ?"}}


def arguments_schema(tool: dict[str, Any]) -> str:
    """The JSON text of the schema a call's arguments are held to, for a lark `%json` rule."""
    parameters = closed_objects(tool["function"].get("parameters") or {"type": "object"})
    return json.dumps({**parameters, **_COMPACT})


def _call_schema(tool: dict[str, Any], arguments_key: str) -> dict[str, Any]:
    function = tool["function"]
    parameters = closed_objects(function.get("parameters") or {"type": "object"})
    return {
        "type": "object",
        "properties": {"name": {"const": function["name"]}, arguments_key: parameters},
        "required": ["name", arguments_key],
        "additionalProperties": False,
    }
