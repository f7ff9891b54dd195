"""How this server reads JSON schemas it constrains output to.

An object schema that lists its properties but says nothing of others gets
`additionalProperties: false`: the model writes the properties asked for and stops, as
llama-server's converter and OpenAI's strict mode have it, instead of inventing keys until its
token budget runs out (which plain JSON Schema would allow).
"""

from __future__ import annotations

from typing import Any


def tuple_items(schema: Any) -> Any:
    """A copy of a draft-7 `schema` whose tuple `items` lists (and `additionalItems`) are
    written as draft 2020-12's `prefixItems` (and `items`), which the grammar compiler reads."""
    if isinstance(schema, list):
        return [tuple_items(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    converted = {key: tuple_items(value) for key, value in schema.items()}
    if isinstance(converted.get("items"), list):
        converted["prefixItems"] = converted.pop("items")
        if "additionalItems" in converted:
            converted["items"] = converted.pop("additionalItems")
    return converted


def closed_objects(schema: Any) -> Any:
    """A copy of `schema` whose objects with `properties` allow no others unless they say so."""
    if isinstance(schema, list):
        return [closed_objects(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    closed = {key: closed_objects(value) for key, value in schema.items()}
    if "properties" in closed and "additionalProperties" not in closed:
        closed["additionalProperties"] = False
    return closed
