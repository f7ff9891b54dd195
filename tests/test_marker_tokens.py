"""A forced call on a model whose vocabulary holds its format's markers as special tokens.

Each format's forcing grammar names its markers (`<tool_call>`, `[TOOL_CALLS]`,
DeepSeek's fullwidth ones ...) as the special tokens they are in the vocabularies of the models
that write that format. A tiny random-weight GGUF is built per format with those markers as
control tokens (bench/models.py's `specials`), and a call forced on it must come back as a
call whose arguments validate, each marker it wrote one token (as logprobs show the answer's
tokens), none spelled out piece by piece, which a random model did when llama.cpp's grammar
sampler, which matches a marker by its text, held the grammar.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import pytest

from mlxcel.parsers.tools import CALL_GRAMMARS
from tests.conftest import start
from tests.server_process import ServerProcess

# An enum keeps a random model's argument short: the grammar leaves it two values to pick.
PARAMETERS = {
    "type": "object",
    "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
    "required": ["city"],
    "additionalProperties": False,
}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": PARAMETERS}}
FORMATS = sorted(name for name, grammar in CALL_GRAMMARS.items() if grammar([TIME], False).markers)


def markers(name: str) -> tuple[str, ...]:
    return CALL_GRAMMARS[name]([TIME], False).markers


@pytest.fixture(scope="module", params=FORMATS)
def marked_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, built_models: Path
) -> Iterator[tuple[str, ServerProcess]]:
    from bench.models import SHAPES, build, tiny

    name = request.param
    model = build(tiny(SHAPES["smollm2-135m"]), built_models, specials=markers(name)).path
    proc = start(tmp_path_factory.mktemp(name), "-m", str(model), "--tool-call-parser", name)
    yield name, proc
    proc.stop_soon()


@pytest.mark.slow
def test_forced_call_writes_its_markers_as_special_tokens(
    marked_server: tuple[str, ServerProcess],
) -> None:
    name, server = marked_server
    response = server.openai().chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": "What time is it in Paris?"}],
        tools=[TIME],  # type: ignore[list-item]
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=200,
        temperature=0,
        logprobs=True,
    )
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls", choice.message.content
    calls = choice.message.tool_calls
    assert calls and len(calls) == 1
    assert calls[0].function.name == "get_time"  # type: ignore[union-attr]
    jsonschema.validate(json.loads(calls[0].function.arguments), PARAMETERS)  # type: ignore[union-attr]
    assert choice.logprobs and choice.logprobs.content
    tokens = [entry.token for entry in choice.logprobs.content]
    written = "".join(tokens)
    assert any(token in markers(name) for token in tokens), tokens
    for marker in markers(name):
        # Every marker written is one token: none is spelled out piece by piece.
        assert written.count(marker) == tokens.count(marker), (marker, tokens)
