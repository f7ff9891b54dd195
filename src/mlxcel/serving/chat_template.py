"""Chat messages -> prompt text through the model's own Jinja chat template.

A template sees what llama-server gives it: `messages`, `add_generation_prompt`, `bos_token`,
`eos_token`, today's `date_string` and `strftime_now(format)`, `raise_exception`, the server's
defaults (`enable_thinking` from --reasoning, --chat-template-kwargs) and the request's extras.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import missing

from mlxcel.chat_templates import CHATML
from mlxcel.engine.types import ChatTemplate
from mlxcel.protocol.errors import invalid_request

__all__ = ["CHATML", "render_chat"]

# The names a render looked up that the template's context does not define.
_undefined_names: ContextVar[list[str] | None] = ContextVar("undefined_names", default=None)


class _NotedUndefined(jinja2.Undefined):
    """Undefined, as Jinja's own, that notes the variable name it stands for."""

    def __init__(
        self,
        hint: str | None = None,
        obj: Any = missing,
        name: str | None = None,
        exc: type[jinja2.TemplateRuntimeError] = jinja2.UndefinedError,
    ) -> None:
        super().__init__(hint, obj, name, exc)
        noted = _undefined_names.get()
        if noted is not None and obj is missing and name is not None and name not in noted:
            noted.append(name)


@contextmanager
def _noting() -> Iterator[list[str]]:
    names: list[str] = []
    token = _undefined_names.set(names)
    try:
        yield names
    finally:
        _undefined_names.reset(token)


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=8)
def _compile(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=["jinja2.ext.loopcontrols"],
        undefined=_NotedUndefined,
    )
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(source)


def render_chat(
    template: ChatTemplate | None,
    messages: list[dict[str, Any]],
    *,
    add_generation_prompt: bool = True,
    extra: Mapping[str, Any] | None = None,
) -> str:
    """The prompt for `messages`; `extra` (chat_template_kwargs) reaches the template too,
    over the server's defaults."""
    source = template.source if template else CHATML
    with _noting() as undefined:
        try:
            context = {
                # llama.cpp's date format (Llama 3.x templates print it).
                "date_string": datetime.now().strftime("%d %b %Y"),
                **(template.defaults if template else {}),
                **(extra or {}),
                "messages": messages,
                "add_generation_prompt": add_generation_prompt,
                "bos_token": template.bos_token if template else "",
                "eos_token": template.eos_token if template else "",
            }
            return _compile(source).render(context)
        except Exception as exc:  # a template may fail in any way (TypeError on None + str too)
            lacked = f" (it used {', '.join(map(repr, undefined))}, not defined here)"
            raise invalid_request(
                f"the chat template rejected the messages: {exc}{lacked if undefined else ''}",
                "messages",
            ) from exc
