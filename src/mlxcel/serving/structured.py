"""Structured outputs: a request's response_format / json_schema / grammar -> one constraint."""

from __future__ import annotations

import json
from typing import Any

import jsonschema

from mlxcel.parsers.schemas import closed_objects, tuple_items
from mlxcel.protocol.common import SamplingFields
from mlxcel.protocol.errors import invalid_request

# json_object mode: any JSON object, as OpenAI's {"type": "json_object"} promises.
ANY_OBJECT: dict[str, Any] = {"type": "object"}
# How far a JSON schema may nest (levels of objects and arrays, `properties` maps included: 20
# nested objects) and how large it may be as JSON text. Checking and compiling a schema walk it
# recursively; these keep that walk bounded.
MAX_SCHEMA_DEPTH = 40
MAX_SCHEMA_BYTES = 256 * 1024


def _depth(value: Any) -> int:
    """Levels of objects and arrays in a JSON value, counted without recursion."""
    deepest = 0
    stack = [(value, 1)]
    while stack:
        item, level = stack.pop()
        children = item.values() if isinstance(item, dict) else item
        if isinstance(item, (dict, list)):
            deepest = max(deepest, level)
            if level > MAX_SCHEMA_DEPTH:
                break
            stack.extend((child, level + 1) for child in children)
    return deepest


def _valid_draft7(schema: dict[str, Any]) -> bool:
    try:
        jsonschema.Draft7Validator.check_schema(schema)
    except jsonschema.SchemaError:
        return False
    return True


def checked_schema(schema: Any, param: str) -> str:
    """The schema as JSON text, or a 400 naming `param` if it is not a valid JSON Schema or
    goes past MAX_SCHEMA_DEPTH or MAX_SCHEMA_BYTES."""
    if not isinstance(schema, dict):
        raise invalid_request("a JSON schema must be an object", param, "invalid_json_schema")
    if _depth(schema) > MAX_SCHEMA_DEPTH:
        raise invalid_request(
            f"the JSON schema nests deeper than {MAX_SCHEMA_DEPTH} levels of objects and arrays",
            param,
            "json_schema_too_deep",
        )
    size = len(json.dumps(schema))
    if size > MAX_SCHEMA_BYTES:
        raise invalid_request(
            f"the JSON schema is {size} bytes as JSON; the limit is {MAX_SCHEMA_BYTES}",
            param,
            "json_schema_too_large",
        )
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        if "$schema" in schema or not _valid_draft7(schema):
            raise invalid_request(
                f"invalid JSON schema: {exc.message}", param, "invalid_json_schema"
            ) from exc
        # Valid as draft 7 (which llama-server reads, tuple `items` lists and all), not as
        # the newest draft a schema without `$schema` is read as.
        schema = tuple_items(schema)
    return json.dumps(closed_objects(schema))


def response_format_schema(response_format: dict[str, Any] | None, param: str) -> str | None:
    """The schema an OpenAI response_format (chat) or text.format (Responses) asks for."""
    kind = (response_format or {}).get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        # llama-server's extension: a json_object format may carry the schema to follow.
        schema = (response_format or {}).get("schema")
        return (
            json.dumps(ANY_OBJECT) if schema is None else checked_schema(schema, f"{param}.schema")
        )
    if kind == "json_schema":
        assert response_format is not None
        # Chat nests the schema under json_schema; Responses puts it on the format itself.
        holder = response_format.get("json_schema", response_format)
        if not isinstance(holder, dict) or "schema" not in holder:
            raise invalid_request("json_schema needs a 'schema'", f"{param}.json_schema")
        return checked_schema(holder["schema"], f"{param}.json_schema.schema")
    raise invalid_request(f"unknown {param} type '{kind}'", f"{param}.type")


def output_schema(request: SamplingFields) -> str | None:
    """The JSON schema text a request's output must follow, if any; a bad one is a 400."""
    value, param = request.output_format()
    if value is None:
        return None
    if param == "json_schema":
        return checked_schema(value, param)
    return response_format_schema(value, param)
