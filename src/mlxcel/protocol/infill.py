"""POST /infill request body: llama-server's code infill (fill-in-the-middle)."""

from __future__ import annotations

from pydantic import Field

from mlxcel.protocol.common import Strict
from mlxcel.protocol.native import NativeCompletionRequest


class ExtraFile(Strict):
    """Another file of the project, shown to the model before the code being completed."""

    text: str
    filename: str = "tmp"


class InfillRequest(NativeCompletionRequest):
    """/completion's fields, plus the code around the gap; `prompt` is text after the prefix."""

    input_prefix: str
    input_suffix: str
    input_extra: list[ExtraFile] = Field(default_factory=list)
    prompt: str = ""
