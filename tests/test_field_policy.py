"""The request-field tables of docs/routes.md show each field in the class the schemas give it."""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import BaseModel

from mlxcel.protocol.chat import ChatCompletionRequest, ChatMessage, ContentPart, ToolCall
from mlxcel.protocol.common import StreamOptions
from mlxcel.protocol.completions import CompletionRequest
from mlxcel.protocol.native import NativeCompletionRequest
from mlxcel.protocol.policy import FieldClass, field_class

ROUTES_PAGE = Path(__file__).resolve().parent.parent / "docs" / "routes.md"
REQUESTS: tuple[type[BaseModel], ...] = (
    ChatCompletionRequest,
    CompletionRequest,
    NativeCompletionRequest,
)
# Nested request objects, under the names docs/routes.md gives their fields.
NESTED: dict[str, type[BaseModel]] = {
    "stream_options.": StreamOptions,
    "messages[].": ChatMessage,
    "messages[].content[].": ContentPart,
    "messages[].tool_calls[].": ToolCall,
}


def _tables() -> list[set[str]]:
    """The field names in the first column of each table of the request-field section."""
    section = ROUTES_PAGE.read_text().split("### Request fields", 1)[1].split("\n## ", 1)[0]
    tables: list[set[str]] = []
    for block in re.split(r"\n\n+", section):
        rows = [line for line in block.splitlines() if line.startswith("| `")]
        if rows:
            first_cells = [row.split(" | ", 1)[0] for row in rows]
            tables.append({name for cell in first_cells for name in re.findall(r"`([^`]+)`", cell)})
    return tables


def _fields() -> dict[str, FieldClass]:
    """Every field of the chat, completions and /completion bodies and their parts."""
    classes: dict[str, FieldClass] = {}
    for model in REQUESTS:
        for name in model.model_fields:
            classes[name] = field_class(model, name)
    for prefix, model in NESTED.items():
        for name in model.model_fields:
            classes[prefix + name] = field_class(model, name)
    return classes


def test_the_page_has_a_table_per_class() -> None:
    honoured, no_effect, refused = _tables()
    assert "temperature" in honoured and "service_tier" in no_effect and "prediction" in refused


def test_each_marked_field_is_in_its_table() -> None:
    _, no_effect, refused = _tables()
    classes = _fields()
    assert {name for name, c in classes.items() if c == "no effect"} == no_effect
    assert {name for name, c in classes.items() if c == "refused"} <= refused


def test_every_top_level_field_is_documented() -> None:
    documented = set().union(*_tables())
    # Composite names (`stream`, `stream_options.include_usage`) document their first part.
    documented |= {name.split(".")[0] for name in documented}
    missing = {name for name in _fields() if "." not in name} - documented
    assert not missing, missing
