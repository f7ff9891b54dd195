"""Chat messages -> prompt text through the model's own Jinja chat template."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import date
from functools import lru_cache
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from mlxcel.engine.types import ChatTemplate
from mlxcel.serving.errors import invalid_request

# Used when a model ships no template of its own; ChatML is what most small models know.
CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return date.today().strftime(fmt)


@lru_cache(maxsize=8)
def _compile(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
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
    """The prompt for `messages`; `extra` (chat_template_kwargs) reaches the template too."""
    source = template.source if template else CHATML
    try:
        context = {
            **(extra or {}),
            "messages": messages,
            "add_generation_prompt": add_generation_prompt,
            "bos_token": template.bos_token if template else "",
            "eos_token": template.eos_token if template else "",
        }
        return _compile(source).render(context)
    except jinja2.TemplateError as exc:
        raise invalid_request(
            f"the chat template rejected the messages: {exc}", "messages"
        ) from exc
