"""Request fields shared by chat and text completions."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class Strict(BaseModel):
    """A request object that names any field it does not know, instead of ignoring it."""

    model_config = ConfigDict(extra="forbid")


class StreamOptions(Strict):
    include_usage: bool = False


class SamplingFields(Strict):
    """OpenAI sampling fields both text routes honour."""

    model: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(default=None, ge=0)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    stop: str | list[str] | None = Field(default=None)
    seed: int | None = None
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    user: str | None = None
    # llama-server's sampling knobs, sent by OpenAI clients through extra_body.
    top_k: int | None = Field(default=None, ge=0)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    repeat_penalty: float | None = Field(default=None, gt=0.0)
    repetition_penalty: float | None = Field(default=None, gt=0.0)
    repeat_last_n: int | None = Field(default=None, ge=-1)
    # Fields the OpenAI API defines that later work will implement: accepted by the
    # schema only so that a request using them gets a 400 that names them.
    n: int | None = None
    logprobs: Any = None
    top_logprobs: int | None = None
    logit_bias: dict[str, float] | None = None

    def unsupported(self) -> str | None:
        """The first field set to something this server does not do yet."""
        if self.n not in (None, 1):
            return "n"
        if self.logprobs not in (None, False, 0):
            return "logprobs"
        if self.top_logprobs not in (None, 0):
            return "top_logprobs"
        if self.logit_bias:
            return "logit_bias"
        return None

    def stop_strings(self) -> tuple[str, ...]:
        """`stop` as a tuple, whatever shape it came in."""
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
