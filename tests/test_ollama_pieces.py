"""The Ollama translation's pieces without a server: keep_alive durations, and tool calls going
out whole, each as soon as the model has finished writing it."""

from __future__ import annotations

from typing import Any

import pytest

from mlxcel.engine.types import TokenEvent
from mlxcel.protocol.ollama import keep_alive_seconds
from mlxcel.serving.ollama import OllamaJob, OllamaPieces
from mlxcel.serving.tools import ToolPlan
from tests.test_ollama import WEATHER


@pytest.mark.parametrize(
    ("value", "seconds"),
    [(0, 0.0), ("0", 0.0), ("5m", 300.0), ("1h30m", 5400.0), ("1.5s", 1.5), (-1, float("inf")),
     ("-1m", float("inf")), (30, 30.0), ("250ms", 0.25)],
)  # fmt: skip
def test_keep_alive_durations(value: Any, seconds: float) -> None:
    assert keep_alive_seconds(value) == seconds


def test_tool_calls_stream_whole_as_each_one_ends() -> None:
    tools = ToolPlan([WEATHER], "hermes", None)
    job = OllamaJob(None, None, tools, "m", True, 0.0)  # type: ignore[arg-type]
    pieces = OllamaPieces(job)
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "%s"}}\n</tool_call>\n'
    text = call % "Paris" + call % "Oslo"
    out = []
    for index in range(0, len(text), 5):
        out += pieces.feed(TokenEvent(text[index : index + 5], ()))
    out += pieces.feed(TokenEvent("", (), finish_reason="stop"))
    calls = [piece["tool_calls"] for piece in out if "tool_calls" in piece]
    assert [[c["function"]["arguments"]["city"] for c in piece] for piece in calls] == [
        ["Paris"],
        ["Oslo"],
    ]
    assert [c["function"]["index"] for piece in calls for c in piece] == [0, 1]
