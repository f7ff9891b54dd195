"""Tool-call parsers behind a registry keyed by name."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from mlxcel.parsers.tools import (
    deepseek_v3,
    functionary,
    glm,
    harmony,
    hermes,
    invoke_xml,
    kimi_k2,
    qwen3_coder,
)
from mlxcel.parsers.tools.base import (
    Delta,
    Reasoning,
    Text,
    ToolArguments,
    ToolCallParser,
    ToolEnd,
    ToolStart,
)
from mlxcel.parsers.tools.grammar import (
    CallGrammar,
    ForcedGrammar,
    Tools,
    gbnf,
    json_call_grammar,
)
from mlxcel.parsers.tools.hermes import HermesParser
from mlxcel.parsers.tools.json_calls import (
    FIREFUNCTION,
    GRANITE,
    bare_json,
    firefunction,
    granite,
    llama3_json,
    mistral,
)
from mlxcel.parsers.tools.whole import WholeCalls


class ParserFactory(Protocol):
    """Makes a parser for one answer; formats whose values are typed by schema read `tools`."""

    def __call__(self, tools: Tools | None = None) -> ToolCallParser: ...


def _untyped(factory: Callable[[], ToolCallParser]) -> ParserFactory:
    """The factory of a format that reads its calls without the request's tools."""

    def make(tools: Tools | None = None) -> ToolCallParser:
        return factory()

    return make


PARSERS: dict[str, ParserFactory] = {
    "hermes": HermesParser,
    "llama3_json": _untyped(llama3_json),
    "mistral": _untyped(mistral),
    "json": _untyped(bare_json),
    "qwen3_coder": qwen3_coder.Qwen3CoderParser,
    "deepseek_v3": _untyped(deepseek_v3.DeepSeekV3Parser),
    # gpt-oss channels: reads reasoning (analysis) and content (final) as well as calls.
    "harmony": _untyped(harmony.HarmonyParser),
    "kimi_k2": _untyped(kimi_k2.KimiK2Parser),
    "glm": glm.GlmParser,
    "functionary_v3_2": _untyped(functionary.FunctionaryV32Parser),
    "minimax_m2": invoke_xml.minimax_m2,
    "deepseek_v32": invoke_xml.deepseek_v32,
    "deepseek_v4": invoke_xml.deepseek_v4,
    "granite": _untyped(granite),
    "firefunction": _untyped(firefunction),
}

# The grammar that forces calls written as each format's parser reads them.
CALL_GRAMMARS: dict[str, CallGrammar] = {
    "hermes": json_call_grammar(
        "arguments",
        "<tool_call>\n",
        "\n</tool_call>\n<tool_call>\n",
        "\n</tool_call>",
        markers=(hermes.OPEN, hermes.CLOSE),
    ),
    "llama3_json": json_call_grammar("parameters", "", None, ""),
    "mistral": json_call_grammar("arguments", "[TOOL_CALLS][", ", ", "]", ("[TOOL_CALLS]",)),
    "json": json_call_grammar("arguments", "", None, ""),
    "qwen3_coder": gbnf(qwen3_coder.forced_grammar, (qwen3_coder.OPEN, qwen3_coder.CLOSE)),
    "deepseek_v3": gbnf(deepseek_v3.forced_grammar, deepseek_v3.MARKERS),
    "harmony": gbnf(harmony.forced_grammar, harmony.MARKERS),
    "kimi_k2": kimi_k2.forced_grammar,
    "glm": gbnf(glm.forced_grammar, glm.MARKERS),
    "functionary_v3_2": functionary.forced_grammar,
    "minimax_m2": gbnf(invoke_xml.forced_grammar(invoke_xml.MINIMAX), invoke_xml.MINIMAX.markers),
    "deepseek_v32": gbnf(
        invoke_xml.forced_grammar(invoke_xml.DEEPSEEK_V32), invoke_xml.DEEPSEEK_V32.markers
    ),
    "deepseek_v4": gbnf(
        invoke_xml.forced_grammar(invoke_xml.DEEPSEEK_V4), invoke_xml.DEEPSEEK_V4.markers
    ),
    "granite": json_call_grammar("arguments", f"{GRANITE}[", ", ", "]", (GRANITE,)),
    "firefunction": json_call_grammar("arguments", f" {FIREFUNCTION}[", ", ", "]"),
}

# The text that ends one call, where a format has one: the stop that ends an answer after its
# first call (`parallel_tool_calls: false`) when no grammar holds it to one.
CALL_ENDS: dict[str, str] = {"hermes": hermes.CLOSE}

# How each format writes one call, for models whose template cannot show tools: the system
# message that lists the tools shows this shape, so the model writes what the parser reads.
CALL_EXAMPLES: dict[str, str] = {
    "hermes": '<tool_call>{"name": NAME, "arguments": {...}}</tool_call>',
    "llama3_json": '{"name": NAME, "parameters": {...}}',
    "mistral": '[TOOL_CALLS][{"name": NAME, "arguments": {...}}]',
    "json": '{"name": NAME, "arguments": {...}}',
    "qwen3_coder": (
        "<tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n</function>\n"
        "</tool_call>"
    ),
    "deepseek_v3": (
        f"{deepseek_v3.CALLS_BEGIN}{deepseek_v3.CALL_BEGIN}function{deepseek_v3.SEP}NAME"
        f"\n```json\n{{...}}\n```{deepseek_v3.CALL_END}{deepseek_v3.CALLS_END}"
    ),
    "harmony": "<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}",
    "kimi_k2": (
        f"{kimi_k2.SECTION_BEGIN}{kimi_k2.CALL_BEGIN}functions.NAME:0{kimi_k2.ARGUMENTS_BEGIN}"
        f"{{...}}{kimi_k2.CALL_END}{kimi_k2.SECTION_END}"
    ),
    "glm": "<tool_call>NAME\n<arg_key>KEY</arg_key>\n<arg_value>VALUE</arg_value>\n</tool_call>",
    "functionary_v3_2": ">>>NAME\n{...}",
    "minimax_m2": '<minimax:tool_call>\n<invoke name="NAME"><parameter name="KEY">VALUE</parameter>'
    "</invoke>\n</minimax:tool_call>",
    "deepseek_v32": f'{invoke_xml.DEEPSEEK_V32.begin}\n<{invoke_xml.DSML}invoke name="NAME">'
    f'<{invoke_xml.DSML}parameter name="KEY" string="true">VALUE</{invoke_xml.DSML}parameter>'
    f"</{invoke_xml.DSML}invoke>\n{invoke_xml.DEEPSEEK_V32.end}",
    "deepseek_v4": f'{invoke_xml.DEEPSEEK_V4.begin}\n<{invoke_xml.DSML}invoke name="NAME">'
    f'<{invoke_xml.DSML}parameter name="KEY" string="true">VALUE</{invoke_xml.DSML}parameter>'
    f"</{invoke_xml.DSML}invoke>\n{invoke_xml.DEEPSEEK_V4.end}",
    "granite": f'{GRANITE}[{{"name": NAME, "arguments": {{...}}}}]',
    "firefunction": f'{FIREFUNCTION}[{{"name": NAME, "arguments": {{...}}}}]',
}

# Markup a chat template writes for tool calls, and the parser that reads it (first match).
# Qwen3-Coder's template also writes <tool_call>, so its <function= comes before hermes; Llama
# 3.2's shows no <|python_tag|>, only its ipython role, which Hermes-3 on Llama 3.1 has too.
_TEMPLATE_MARKERS = (
    ("<|channel|>", "harmony"),
    ("tool_calls_section_begin", "kimi_k2"),
    ("<arg_key>", "glm"),
    (">>>all", "functionary_v3_2"),
    ("<minimax:tool_call>", "minimax_m2"),
    ("'tool_calls>", "deepseek_v4"),
    ("DSML", "deepseek_v32"),
    ("<|tool_call|>", "granite"),
    (FIREFUNCTION, "firefunction"),
    ("<function=", "qwen3_coder"),
    ("<parameter=", "qwen3_coder"),
    ("tool▁calls▁begin", "deepseek_v3"),
    ("<tool_call>", "hermes"),
    ("[TOOL_CALLS]", "mistral"),
    ("<|python_tag|>", "llama3_json"),
    ("ipython", "llama3_json"),
)
# For templates that show no call markup: the format the forcing grammar writes best.
DEFAULT_PARSER = "hermes"


def detect_parser(template_source: str | None) -> str:
    """The parser for the tool-call markup a chat template uses ('auto')."""
    for marker, name in _TEMPLATE_MARKERS:
        if template_source and marker in template_source:
            return name
    return DEFAULT_PARSER


__all__ = [
    "CALL_ENDS",
    "CALL_EXAMPLES",
    "CALL_GRAMMARS",
    "DEFAULT_PARSER",
    "PARSERS",
    "Delta",
    "ForcedGrammar",
    "ParserFactory",
    "Reasoning",
    "Text",
    "ToolArguments",
    "ToolCallParser",
    "ToolEnd",
    "ToolStart",
    "Tools",
    "WholeCalls",
    "detect_parser",
]
