"""Request fields shared by chat and text completions."""

from __future__ import annotations

from typing import Annotated, Any, Literal, cast

from pydantic import BeforeValidator, Field

from mlxcel.protocol.policy import NoEffect, Strict

# How hard a reasoning model should think, as the OpenAI API names it.
ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"]

# The smallest repetition penalty taken (llama-server takes any, and aborts below float32's).
MIN_PENALTY = 1e-6

# OpenAI's logit_bias bounds; llama-server's `false` bans a token like -100 does.
BIAS_LIMIT = 100.0


def _bias_pairs(value: Any) -> Any:
    """OpenAI's {token: bias} object as llama-server's [[token, bias], ...] pairs."""
    return list(value.items()) if isinstance(value, dict) else value


def _bias_key(value: Any) -> Any:
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


def _bias_value(value: Any) -> Any:
    if value is False:
        return -BIAS_LIMIT
    if value is True:
        raise ValueError("true has no meaning here: give a number, or false to ban the token")
    if isinstance(value, (int, float)) and not -BIAS_LIMIT <= value <= BIAS_LIMIT:
        raise ValueError("a bias must be between -100 and 100")
    return value


# A token id (as a number or a string of digits), or a text whose every token gets the bias.
LogitBias = Annotated[
    list[
        tuple[
            Annotated[str, BeforeValidator(_bias_key)],
            Annotated[float, BeforeValidator(_bias_value)],
        ]
    ],
    BeforeValidator(_bias_pairs),
]


# One prompt: text, token ids, or both mixed ([12, 34, "text"]); or a batch of such prompts.
Prompt = str | list[int | str]
Prompts = str | list[int | str] | list[str | list[int | str]]


def prompt_batch(prompt: Prompts) -> list[Prompt]:
    """The prompts a `prompt` field holds, as llama-server reads it: a flat list with a token
    id in it is one prompt, any other list is a batch."""
    if isinstance(prompt, str):
        return [prompt]
    if any(isinstance(p, int) for p in prompt) and not any(isinstance(p, list) for p in prompt):
        return [cast(list[int | str], prompt)]
    return cast(list[Prompt], list(prompt))


class StreamOptions(Strict):
    include_usage: bool = False
    include_obfuscation: Annotated[
        bool | None, NoEffect("the stream is not padded: nothing here sees it")
    ] = None


class LoraChoice(Strict):
    """llama-server's per-request adapter: its id (GET /lora-adapters) and scale."""

    id: int
    scale: float


class SamplingFields(Strict):
    """Sampling fields every text route honours: OpenAI's, then llama-server's knobs."""

    model: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    # 0 evaluates the prompt (into the prefix cache) and generates nothing, as n_predict 0 does.
    max_tokens: int | None = Field(default=None, ge=0)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    # 0 keeps only the most likely token.
    top_p: float | None = Field(default=None, ge=0.0, le=1.0)
    stop: str | list[str] | None = Field(default=None)
    seed: int | None = None
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    logit_bias: LogitBias | None = None
    n: int = Field(default=1, ge=1, le=16)
    user: str | None = None
    safety_identifier: str | None = None
    # OpenAI's cache-routing hint (Codex sends one per conversation).
    prompt_cache_key: Annotated[
        str | None,
        NoEffect("the prefix cache matches the prompt's tokens themselves: a key adds nothing"),
    ] = None
    # llama-server's (and vLLM's) knobs; OpenAI clients send them through extra_body.
    top_k: int | None = Field(default=None, ge=0)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    typical_p: float | None = Field(default=None, gt=0.0, le=1.0)
    # Above 0, and not so near it that llama.cpp's float32 copy is 0: it divides by it (a
    # penalty of 1e-309 aborted the worker in llama_sampler's assert).
    repeat_penalty: float | None = Field(default=None, ge=MIN_PENALTY)
    repetition_penalty: float | None = Field(default=None, ge=MIN_PENALTY)
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
    n_predict: int | None = Field(default=None, ge=-1)
    n_probs: int = Field(default=0, ge=0, le=100)
    post_sampling_probs: bool | None = None
    """Report `prob` and `top_probs` after the sampler chain instead of the model's own
    `logprob` and `top_logprobs` (llama-server's field)."""
    cache_prompt: bool = True
    id_slot: int = Field(default=-1, ge=-1)
    # Names (["top_k", "temperature"]) or llama-server's one-letter string ("kt").
    samplers: list[str] | str | None = None
    mirostat: Literal[0, 1, 2] = 0
    mirostat_tau: float | None = Field(default=None, ge=0.0)
    mirostat_eta: float | None = Field(default=None, ge=0.0)
    t_max_predict_ms: float = Field(default=0.0, ge=0.0)
    timings_per_token: bool = False
    return_progress: bool = False
    # llama-server's per-request LoRA adapters: those not named run at 0; [] is the base model.
    lora: list[LoraChoice] | None = None
    verbose: Annotated[bool | None, NoEffect("answers carry no debugging copy of themselves")] = (
        None
    )

    def unsupported(self) -> str | None:
        """The first field set to something this route cannot honour (None: all fine)."""
        return None

    def top_logprobs_wanted(self) -> int | None:
        """None for no log-probabilities, else how many alternatives per token (n_probs)."""
        return self.n_probs or None

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

    def token_limit(self) -> int | None:
        """llama-server's n_predict, else OpenAI's max_tokens; -1 means no limit of its own."""
        limit = self.n_predict if self.n_predict is not None else self.max_tokens
        return None if limit == -1 else limit
