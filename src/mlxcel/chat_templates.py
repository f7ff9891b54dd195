"""Built-in chat templates by llama-server's names (--chat-template NAME), for GGUFs without one.

Each writes the prompt llama.cpp's built-in template of that name writes (src/llama-chat.cpp),
as Jinja. None writes a BOS token: the tokenizer adds it, as it does for llama.cpp's.
"""

from __future__ import annotations

# `content` is read through this, so a message without text renders as empty.
_CONTENT = "(message['content'] or '')"

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + (message['content'] or '') + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def _each(body: str, generation_prompt: str) -> str:
    """A template that writes `body` (Jinja) for every message, then the generation prompt."""
    tail = f"{{% if add_generation_prompt %}}{{{{ {generation_prompt!r} }}}}{{% endif %}}"
    return f"{{% for message in messages %}}{body}{{% endfor %}}{tail}"


def _by_role(system: str, user: str, assistant: str) -> str:
    """Jinja for one message: a different expression for each role (others as the user's)."""
    return (
        "{% if message['role'] == 'system' %}{{ " + system + " }}"
        "{% elif message['role'] == 'assistant' %}{{ " + assistant + " }}"
        "{% else %}{{ " + user + " }}{% endif %}"
    )


def _llama2(system_tags: bool) -> str:
    """[INST] turns; the system message opens the first one (in <<SYS>> tags, or bare)."""
    system = (
        f"'<<SYS>>\\n' + {_CONTENT} + '\\n<</SYS>>\\n\\n'" if system_tags else f"{_CONTENT} + '\\n'"
    )
    return (
        "{{ '[INST] ' }}{% set ns = namespace(inside=true) %}"
        "{% for message in messages %}"
        "{% if not ns.inside %}{{ '[INST] ' }}{% set ns.inside = true %}{% endif %}"
        "{% if message['role'] == 'system' %}{{ " + system + " }}"
        f"{{% elif message['role'] == 'assistant' %}}{{{{ {_CONTENT} + '</s>' }}}}"
        "{% set ns.inside = false %}"
        f"{{% else %}}{{{{ {_CONTENT} + ' [/INST]' }}}}{{% endif %}}"
        "{% endfor %}"
    )


def _mistral(leading: str, trailing: str, trim_answers: bool) -> str:
    """Mistral v1/v3: the system message and the user's share an [INST] turn."""
    answer = f"({_CONTENT} | trim)" if trim_answers else _CONTENT
    return (
        "{% set ns = namespace(inside=false) %}{% for message in messages %}"
        "{% if not ns.inside %}{{ " + repr(f"{leading}[INST]{trailing}") + " }}"
        "{% set ns.inside = true %}{% endif %}"
        f"{{% if message['role'] == 'system' %}}{{{{ {_CONTENT} + '\\n\\n' }}}}"
        f"{{% elif message['role'] == 'user' %}}{{{{ {_CONTENT} + {leading + '[/INST]'!r} }}}}"
        f"{{% else %}}{{{{ {trailing!r} + {answer} + '</s>' }}}}{{% set ns.inside = false %}}"
        "{% endif %}{% endfor %}"
    )


def _gemma() -> str:
    """Gemma: user and model turns; a system message is put in front of the next user turn."""
    return (
        "{% set ns = namespace(system='') %}{% for message in messages %}"
        "{% if message['role'] == 'system' %}"
        f"{{% set ns.system = ns.system + ({_CONTENT} | trim) %}}"
        "{% else %}"
        "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
        "{{ '<start_of_turn>' + role + '\\n' }}"
        "{% if ns.system and role != 'model' %}{{ ns.system + '\\n\\n' }}"
        "{% set ns.system = '' %}{% endif %}"
        f"{{{{ ({_CONTENT} | trim) + '<end_of_turn>\\n' }}}}"
        "{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}"
    )


_ROLE_TAG = f"'<|' + message['role'] + '|>\\n' + {_CONTENT}"

BUILTIN_TEMPLATES: dict[str, str] = {
    "chatml": CHATML,
    "llama2": _llama2(system_tags=False),
    "llama2-sys": _llama2(system_tags=True),
    "llama3": _each(
        "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + "
        f"({_CONTENT} | trim) + '<|eot_id|>' }}}}",
        "<|start_header_id|>assistant<|end_header_id|>\n\n",
    ),
    "mistral-v1": _mistral(" ", " ", trim_answers=False),
    "mistral-v3": _mistral("", " ", trim_answers=True),
    "mistral-v3-tekken": _mistral("", "", trim_answers=False),
    "mistral-v7": "{% for message in messages %}"
    + _by_role(
        f"'[SYSTEM_PROMPT] ' + {_CONTENT} + '[/SYSTEM_PROMPT]'",
        f"'[INST] ' + {_CONTENT} + '[/INST]'",
        f"' ' + {_CONTENT} + '</s>'",
    )
    + "{% endfor %}",
    "gemma": _gemma(),
    "phi3": _each(f"{{{{ {_ROLE_TAG} + '<|end|>\\n' }}}}", "<|assistant|>\n"),
    "phi4": _each(
        f"{{{{ '<|im_start|>' + message['role'] + '<|im_sep|>' + {_CONTENT} + '<|im_end|>' }}}}",
        "<|im_start|>assistant<|im_sep|>",
    ),
    "zephyr": _each(f"{{{{ {_ROLE_TAG} + '<|endoftext|>\\n' }}}}", "<|assistant|>\n"),
    "vicuna": _each(
        _by_role(
            f"{_CONTENT} + '\\n\\n'",
            f"'USER: ' + {_CONTENT} + '\\n'",
            f"'ASSISTANT: ' + {_CONTENT} + '</s>\\n'",
        ),
        "ASSISTANT:",
    ),
    "deepseek": _each(
        _by_role(
            _CONTENT,
            f"'### Instruction:\\n' + {_CONTENT} + '\\n'",
            f"'### Response:\\n' + {_CONTENT} + '\\n<|EOT|>\\n'",
        ),
        "### Response:\n",
    ),
    "deepseek2": _each(
        _by_role(
            f"{_CONTENT} + '\\n\\n'",
            f"'User: ' + {_CONTENT} + '\\n\\n'",
            f"'Assistant: ' + {_CONTENT} + '<\uff5cend\u2581of\u2581sentence\uff5c>'",
        ),
        "Assistant:",
    ),
    "deepseek3": _each(
        _by_role(
            f"{_CONTENT} + '\\n\\n'",
            f"'<\uff5cUser\uff5c>' + {_CONTENT}",
            f"'<\uff5cAssistant\uff5c>' + {_CONTENT} + '<\uff5cend\u2581of\u2581sentence\uff5c>'",
        ),
        "<\uff5cAssistant\uff5c>",
    ),
    "command-r": _each(
        "{{ '<|START_OF_TURN_TOKEN|>' + {'system': '<|SYSTEM_TOKEN|>', 'assistant': "
        "'<|CHATBOT_TOKEN|>'}.get(message['role'], '<|USER_TOKEN|>') + "
        f"({_CONTENT} | trim) + '<|END_OF_TURN_TOKEN|>' }}}}",
        "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>",
    ),
}
# Names without a version: the most common of their family.
BUILTIN_TEMPLATES["mistral"] = BUILTIN_TEMPLATES["mistral-v3"]

# Markers in a model's own template, and the built-in that writes the same format
# (--no-jinja), first match wins: llama.cpp's detection, for these formats.
_DETECTION = (
    (("<|im_start|>", "<|im_sep|>"), "phi4"),
    (("<|im_start|>",), "chatml"),
    (("[SYSTEM_PROMPT]",), "mistral-v7"),
    (("' [INST] ' + system_message",), "mistral-v1"),
    (('"[INST]"', "[AVAILABLE_TOOLS]"), "mistral-v3-tekken"),
    (("[AVAILABLE_TOOLS]",), "mistral-v3"),
    (("[INST]", "<<SYS>>"), "llama2-sys"),
    (("[INST]",), "llama2"),
    (("<|assistant|>", "<|end|>"), "phi3"),
    (("<|user|>", "<|endoftext|>"), "zephyr"),
    (("<start_of_turn>",), "gemma"),
    (("USER: ", "ASSISTANT: "), "vicuna"),
    (("### Instruction:", "<|EOT|>"), "deepseek"),
    (("<|START_OF_TURN_TOKEN|>", "<|USER_TOKEN|>"), "command-r"),
    (("<|start_header_id|>", "<|end_header_id|>"), "llama3"),
    (("'Assistant: ' + message['content'] + eos_token",), "deepseek2"),
    (("<\uff5cAssistant\uff5c>", "<\uff5cUser\uff5c>"), "deepseek3"),
)


def builtin_for(source: str | None) -> str:
    """The built-in that writes the format of a model's own template; ChatML when none does
    (llama.cpp's fallback too)."""
    for markers, name in _DETECTION:
        if source and all(marker in source for marker in markers):
            return name
    return "chatml"
