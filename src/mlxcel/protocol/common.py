"""Request fields shared by chat and text completions."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

# How hard a reasoning model should think, as the OpenAI API names it.
ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"]


class Strict(BaseModel):
    """A request object that names any field it does not know, instead of ignoring it."""

    model_config = ConfigDict(extra="forbid")


class StreamOptions(Strict):
    include_usage: bool = False


class SamplingFields(Strict):
    """Sampling fields every text route honours: OpenAI's, then llama-server's knobs."""

    model: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    stop: str | list[str] | None = Field(default=None)
    seed: int | None = None
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    logit_bias: dict[int, float] | None = None
    n: int = Field(default=1, ge=1, le=16)
    user: str | None = None
    safety_identifier: str | None = None
    # OpenAI's cache-routing hint (Codex sends one per conversation). Accepted: the prefix cache
    # here matches the prompt's tokens themselves, so a key has nothing to add.
    prompt_cache_key: str | None = None
    # llama-server's (and vLLM's) knobs; OpenAI clients send them through extra_body.
    top_k: int | None = Field(default=None, ge=0)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    typical_p: float | None = Field(default=None, gt=0.0, le=1.0)
    repeat_penalty: float | None = Field(default=None, gt=0.0)
    repetition_penalty: float | None = Field(default=None, gt=0.0)
    repeat_last_n: int | None = Field(default=None, ge=-1)
    dry_multiplier: float | None = Field(default=None, ge=0.0)
    dry_base: float | None = Field(default=None, ge=1.0)
    dry_allowed_length: int | None = Field(default=None, ge=0)
    dry_penalty_last_n: int | None = Field(default=None, ge=-1)
    dry_sequence_breakers: list[str] | None = None
    xtc_probability: float | None = Field(default=None, ge=0.0, le=1.0)
    xtc_threshold: float | None = Field(default=None, ge=0.0, le=1.0)
    # p-less sampling (arXiv 2509.23234) and its normalised variant; no hyperparameter.
    p_less: bool | None = None
    p_less_norm: bool | None = None
    min_tokens: int = Field(default=0, ge=0)
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    json_schema: dict[str, Any] | None = None
    grammar: str | None = None

    @field_validator("logit_bias")
    @classmethod
    def _bias_range(cls, value: dict[int, float] | None) -> dict[int, float] | None:
        for token, bias in (value or {}).items():
            if not -100 <= bias <= 100:
                raise ValueError(f"bias for token {token} must be between -100 and 100")
        return value

    def unsupported(self) -> str | None:
        """The first field set to something this route cannot honour (None: all fine)."""
        return None

    def top_logprobs_wanted(self) -> int | None:
        """None for no log-probabilities, else how many alternatives per token."""
        return None

    def output_format(self) -> tuple[dict[str, Any] | None, str]:
        """What constrains the output and the field it came from: a bare JSON schema for
        llama-server's `json_schema`, an OpenAI format object for `response_format`/`text.format`.
        """
        return self.json_schema, "json_schema"

    def stop_strings(self) -> tuple[str, ...]:
        """`stop` as a tuple, whatever shape it came in."""
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    def token_ids_in(self) -> list[int]:
        """Every token id the request names, for checking them against the vocabulary."""
        return [*(self.logit_bias or {}), *(self.stop_token_ids or [])]
