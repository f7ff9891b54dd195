"""The field policy, one rule for every request schema.

A field an API defines (OpenAI's, llama-server's) is honoured, unless its declaration carries
one of these marks:

- `NoEffect(why)`: accepted and ignored, because nothing local applies (a service tier, a
  message's `annotations`); docs/routes.md lists it as having no effect.
- `Refused(why, accepts)`: a 400 naming the field when its value asks for what this server does
  not do (audio output, web search), since ignoring it would give the client something else
  than it asked for; values `accepts` allows (by default only null) pass.

A field no API defines is a 400 naming it (`Strict`), so typos are still caught.
tests/test_field_policy.py holds docs/routes.md's field tables to these marks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, GetCoreSchemaHandler
from pydantic_core import PydanticCustomError, core_schema

FieldClass = Literal["honoured", "no effect", "refused"]


class Strict(BaseModel):
    """A request object that names any field it does not know, instead of ignoring it."""

    model_config = ConfigDict(extra="forbid")


@dataclass(frozen=True)
class NoEffect:
    """Mark: the field is accepted and has no effect here, for the reason given."""

    why: str


def _is_null(value: Any) -> bool:
    return value is None


@dataclass(frozen=True)
class Refused:
    """Mark: a value `accepts` does not allow is a 400 naming the field, saying `why`."""

    why: str
    accepts: Callable[[Any], bool] = field(default=_is_null)

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(self._check, handler(source))

    @property
    def only_null(self) -> bool:
        """Whether no value but null passes (the field is never taken)."""
        return self.accepts is _is_null

    def _check(self, value: Any) -> Any:
        if not self.accepts(value):
            raise PydanticCustomError("unsupported_value", self.why)
        return value


def field_class(model: type[BaseModel], name: str) -> FieldClass:
    """Which class of the policy one field of a request schema is in."""
    marks = model.model_fields[name].metadata
    if any(isinstance(mark, Refused) for mark in marks):
        return "refused"
    if any(isinstance(mark, NoEffect) for mark in marks):
        return "no effect"
    return "honoured"
