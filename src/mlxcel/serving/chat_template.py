"""Chat messages -> prompt text through the model's own Jinja chat template.

A template sees what llama-server gives it: `messages`, `add_generation_prompt`, `bos_token`,
`eos_token`, `tools` and `functions` (their JSON text, which firefunction-v2 prints), today's
`date_string`, `datetime` and `strftime_now(format)`, `raise_exception`, the server's defaults
(`enable_thinking` from --reasoning, --chat-template-kwargs) and the request's extras. The
messages and tools come in the shape every template reads (serving/template_inputs.py), and
the environment has what templates written for Hugging Face use: `tojson` with its keyword
arguments, the `{% generation %}` block, lists a template may append to.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import SandboxedEnvironment
from jinja2.utils import missing
from markupsafe import Markup

from mlxcel.chat_templates import CHATML
from mlxcel.engine.types import ChatTemplate
from mlxcel.protocol.errors import invalid_request
from mlxcel.serving.template_inputs import shaped_messages, template_tools, without_system

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


def _json_value(value: Any) -> Any:
    """What `tojson` writes for values JSON has no type for: an undefined variable is null, a
    generator (a `map` filter's result) a list."""
    if isinstance(value, jinja2.Undefined):
        return None
    if isinstance(value, Iterator):
        return list(value)
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> Markup:
    """Hugging Face's `tojson`: json.dumps's keywords, not HTML-escaped."""
    text = json.dumps(
        value,
        ensure_ascii=ensure_ascii,
        indent=indent,
        separators=separators,
        sort_keys=sort_keys,
        default=_json_value,
    )
    return Markup(text)


class _Generation(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` (Hugging Face marks the assistant's tokens
    with it for training masks): renders its body."""

    tags = {"generation"}  # noqa: RUF012 - jinja2.ext.Extension declares it so

    def parse(self, parser: Any) -> Any:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body, lineno=lineno)


@lru_cache(maxsize=8)
def _compile(source: str) -> jinja2.Template:
    # Mutable (some templates build lists with .append); each render gets its own copies.
    env = SandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=["jinja2.ext.loopcontrols", _Generation],
        undefined=_NotedUndefined,
    )
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.filters["tojson"] = _tojson
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
    shaped = shaped_messages(source, messages)
    with _noting() as undefined:
        try:
            return _render(template, source, shaped, add_generation_prompt, extra)
        except Exception as exc:  # a template may fail in any way (TypeError on None + str too)
            moved = without_system(shaped)
            if moved is not None:
                try:  # Gemma 2's and others' refuse system messages: llama.cpp moves them
                    return _render(template, source, moved, add_generation_prompt, extra)
                except Exception:  # the first error says more
                    pass
            lacked = f" (it used {', '.join(map(repr, undefined))}, not defined here)"
            raise invalid_request(
                f"the chat template rejected the messages: {exc}{lacked if undefined else ''}",
                "messages",
            ) from exc


def _render(
    template: ChatTemplate | None,
    source: str,
    messages: list[dict[str, Any]],
    add_generation_prompt: bool,
    extra: Mapping[str, Any] | None,
) -> str:
    now = datetime.now()
    tools = template_tools(list((extra or {}).get("tools") or []))
    context = {
        # llama.cpp's date formats (Llama 3.x templates print the first, firefunction-v2's
        # the second).
        "date_string": now.strftime("%d %b %Y"),
        "datetime": now.strftime("%b %d %Y %H:%M:%S GMT"),
        "functions": json.dumps(tools, indent=2) if tools else "",
        **(template.defaults if template else {}),
        **(extra or {}),
        **({"tools": tools} if tools else {}),
        "messages": copy.deepcopy(messages),
        "add_generation_prompt": add_generation_prompt,
        "bos_token": template.bos_token if template else "",
        "eos_token": template.eos_token if template else "",
    }
    return _compile(source).render(context)
