"""What chat templates get: dates, enable_thinking from --reasoning, --chat-template-kwargs,
built-in templates by llama-server's names (--chat-template NAME, --no-jinja), and errors."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import openai
import pytest

from mlxcel.chat_templates import BUILTIN_TEMPLATES, CHATML, builtin_for
from mlxcel.engine.types import ChatTemplate
from mlxcel.protocol.errors import APIError
from mlxcel.serving.chat_template import render_chat
from tests.conftest import applied_prompt, serving
from tests.server_process import ServerProcess

HELLO = [{"role": "user", "content": "hi"}]
# DeepSeek-R1 / QwQ style: a template that closes the think block unless enable_thinking.
THINKING = (
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{%- if messages[0].content == 'boom' and not documents %}"
    "{{ raise_exception('no documents given') }}{% endif %}"
    "<|im_start|>assistant\n"
    "{% if not enable_thinking %}<think>\n\n</think>\n\n{% endif %}"
    "[{{ date_string }}|{{ strftime_now('%Y-%m-%d') }}|{{ greeting }}]"
)
CLOSED = "<think>\n\n</think>"


def _server(tmp: pytest.TempPathFactory, name: str, *args: str) -> Iterator[ServerProcess]:
    yield from serving(tmp, name, "--ctx-size", "512", "--no-warmup", *args)


@pytest.fixture(scope="module")
def thinking(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    yield from _server(tmp_path_factory, "thinking", "--chat-template", THINKING)


@pytest.fixture(scope="module")
def not_thinking(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    yield from _server(
        tmp_path_factory,
        "not-thinking",
        "--chat-template",
        THINKING,
        "--reasoning",
        "off",
        "--chat-template-kwargs",
        '{"greeting": "hej", "enable_thinking": true}',
    )


@pytest.fixture(scope="module")
def llama3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    yield from _server(tmp_path_factory, "llama3", "--chat-template", "llama3")


@pytest.fixture(scope="module")
def no_jinja(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    yield from _server(tmp_path_factory, "no-jinja", "--no-jinja")


def _prompt(server: ServerProcess, **body: Any) -> str:
    return applied_prompt(server, HELLO, **body)


@pytest.mark.slow
def test_the_date_reaches_the_template(thinking: ServerProcess) -> None:
    before = datetime.now()
    prompt = _prompt(thinking)
    days = {before, before + timedelta(days=1)}  # the request may cross midnight
    assert any(f"[{d:%d %b %Y}|{d:%Y-%m-%d}|]" in prompt for d in days), prompt


@pytest.mark.slow
def test_enable_thinking_is_defined_unless_the_request_sets_it(thinking: ServerProcess) -> None:
    assert CLOSED not in _prompt(thinking)
    assert CLOSED in _prompt(thinking, chat_template_kwargs={"enable_thinking": False})
    assert CLOSED in _prompt(thinking, reasoning_effort="none")


@pytest.mark.slow
def test_reasoning_off_and_server_template_kwargs(not_thinking: ServerProcess) -> None:
    prompt = _prompt(not_thinking)
    assert CLOSED in prompt  # --reasoning off wins over --chat-template-kwargs' enable_thinking
    assert "|hej]" in prompt
    overridden = _prompt(
        not_thinking, chat_template_kwargs={"enable_thinking": True, "greeting": "hi"}
    )
    assert CLOSED not in overridden and "|hi]" in overridden


@pytest.mark.slow
def test_a_template_that_raises_names_the_error_and_what_it_lacked(
    thinking: ServerProcess,
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        thinking.openai().chat.completions.create(
            model="default",
            messages=[{"role": "user", "content": "boom"}],
        )
    error = caught.value.body
    assert isinstance(error, dict) and error["param"] == "messages"
    assert "no documents given" in error["message"] and "'documents'" in error["message"]


@pytest.mark.slow
def test_a_built_in_template_by_name(llama3: ServerProcess) -> None:
    assert _prompt(llama3) == (
        "<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    with llama3.http() as http:
        assert http.get("/props").json()["chat_template"] == BUILTIN_TEMPLATES["llama3"]


@pytest.mark.slow
def test_no_jinja_renders_the_built_in_of_the_models_format(
    no_jinja: ServerProcess, server: ServerProcess
) -> None:
    # SmolLM2's own template adds a system message; llama.cpp's built-in chatml does not.
    assert "You are a helpful AI assistant" in _prompt(server)
    assert _prompt(no_jinja) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


CONVERSATION = [
    {"role": "system", "content": "S"},
    {"role": "user", "content": "U1"},
    {"role": "assistant", "content": " A1 "},
    {"role": "user", "content": "U2"},
]
# What llama.cpp's built-in templates (src/llama-chat.cpp) write for CONVERSATION.
LLAMA_CPP = {
    "chatml": "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU1<|im_end|>\n"
    "<|im_start|>assistant\n A1 <|im_end|>\n<|im_start|>user\nU2<|im_end|>\n"
    "<|im_start|>assistant\n",
    "llama2": "[INST] S\nU1 [/INST] A1 </s>[INST] U2 [/INST]",
    "llama2-sys": "[INST] <<SYS>>\nS\n<</SYS>>\n\nU1 [/INST] A1 </s>[INST] U2 [/INST]",
    "llama3": "<|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|>"
    "<|start_header_id|>user<|end_header_id|>\n\nU1<|eot_id|>"
    "<|start_header_id|>assistant<|end_header_id|>\n\nA1<|eot_id|>"
    "<|start_header_id|>user<|end_header_id|>\n\nU2<|eot_id|>"
    "<|start_header_id|>assistant<|end_header_id|>\n\n",
    "mistral-v1": " [INST] S\n\nU1 [/INST]  A1 </s> [INST] U2 [/INST]",
    "mistral-v3": "[INST] S\n\nU1[/INST] A1</s>[INST] U2[/INST]",
    "mistral-v3-tekken": "[INST]S\n\nU1[/INST] A1 </s>[INST]U2[/INST]",
    "mistral-v7": "[SYSTEM_PROMPT] S[/SYSTEM_PROMPT][INST] U1[/INST]  A1 </s>[INST] U2[/INST]",
    "gemma": "<start_of_turn>user\nS\n\nU1<end_of_turn>\n<start_of_turn>model\nA1<end_of_turn>\n"
    "<start_of_turn>user\nU2<end_of_turn>\n<start_of_turn>model\n",
    "phi3": "<|system|>\nS<|end|>\n<|user|>\nU1<|end|>\n<|assistant|>\n A1 <|end|>\n"
    "<|user|>\nU2<|end|>\n<|assistant|>\n",
    "phi4": "<|im_start|>system<|im_sep|>S<|im_end|><|im_start|>user<|im_sep|>U1<|im_end|>"
    "<|im_start|>assistant<|im_sep|> A1 <|im_end|><|im_start|>user<|im_sep|>U2<|im_end|>"
    "<|im_start|>assistant<|im_sep|>",
    "zephyr": "<|system|>\nS<|endoftext|>\n<|user|>\nU1<|endoftext|>\n<|assistant|>\n"
    " A1 <|endoftext|>\n<|user|>\nU2<|endoftext|>\n<|assistant|>\n",
    "vicuna": "S\n\nUSER: U1\nASSISTANT:  A1 </s>\nUSER: U2\nASSISTANT:",
    "deepseek": "S### Instruction:\nU1\n### Response:\n A1 \n<|EOT|>\n### Instruction:\nU2\n"
    "### Response:\n",
    "deepseek2": "S\n\nUser: U1\n\nAssistant:  A1 <\uff5cend\u2581of\u2581sentence\uff5c>"
    "User: U2\n\nAssistant:",
    "deepseek3": "S\n\n<\uff5cUser\uff5c>U1<\uff5cAssistant\uff5c> A1 "
    "<\uff5cend\u2581of\u2581sentence\uff5c><\uff5cUser\uff5c>U2<\uff5cAssistant\uff5c>",
    "command-r": "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>S<|END_OF_TURN_TOKEN|>"
    "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>U1<|END_OF_TURN_TOKEN|>"
    "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>A1<|END_OF_TURN_TOKEN|>"
    "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>U2<|END_OF_TURN_TOKEN|>"
    "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>",
}


@pytest.mark.parametrize("name", sorted(LLAMA_CPP))
def test_built_ins_write_what_llama_cpp_writes(name: str) -> None:
    template = ChatTemplate(BUILTIN_TEMPLATES[name], "<s>", "</s>")
    assert render_chat(template, CONVERSATION) == LLAMA_CPP[name]


def test_every_built_in_has_a_reference_and_mistral_is_v3() -> None:
    assert set(BUILTIN_TEMPLATES) == {*LLAMA_CPP, "mistral"}
    assert BUILTIN_TEMPLATES["mistral"] == BUILTIN_TEMPLATES["mistral-v3"]


@pytest.mark.parametrize(
    ("markers", "name"),
    [
        ("{{ '<|im_start|>' + role }}", "chatml"),
        ("<|start_header_id|>{{ role }}<|end_header_id|>", "llama3"),
        ("[INST] <<SYS>>", "llama2-sys"),
        ("[SYSTEM_PROMPT]{{ s }}[INST]", "mistral-v7"),
        ("<start_of_turn>", "gemma"),
        ("<|assistant|> <|end|>", "phi3"),
        ("<\uff5cUser\uff5c><\uff5cAssistant\uff5c>", "deepseek3"),
        ("{{ something else }}", "chatml"),
    ],
)
def test_no_jinja_finds_the_format_of_a_template(markers: str, name: str) -> None:
    assert builtin_for(markers) == name


def test_template_failures_are_400_whatever_they_raise() -> None:
    template = ChatTemplate("{{ messages[0].content + missing_number }}", "", "")
    with pytest.raises(APIError) as caught:
        render_chat(template, HELLO)
    assert caught.value.status == 400 and "'missing_number'" in caught.value.message
    with pytest.raises(APIError) as typed:
        render_chat(ChatTemplate("{{ 1 + messages[0].content }}", "", ""), HELLO)
    assert typed.value.status == 400
    assert render_chat(None, HELLO) == render_chat(ChatTemplate(CHATML, "", ""), HELLO)
