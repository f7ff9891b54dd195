"""The seam between the engine and the backends: capability protocols and their data."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling, already resolved against the server's defaults."""

    max_tokens: int
    temperature: float
    top_p: float
    top_k: int
    min_p: float
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    stop: tuple[str, ...] = ()


@dataclass(frozen=True)
class Feed:
    """Tokens to evaluate for one sequence in a step, and whether to sample after them."""

    slot: int
    tokens: Sequence[int]
    sample: bool


@dataclass(frozen=True)
class ChatTemplate:
    """A model's own chat template and the special tokens it refers to."""

    source: str
    bos_token: str
    eos_token: str


class TextGenerator(Protocol):
    """A loaded text model that steps a batch of sequences, one slot per sequence."""

    @property
    def n_ctx_seq(self) -> int:
        """Tokens of context one sequence may use."""
        ...

    @property
    def n_slots(self) -> int:
        """Sequences that can decode together."""
        ...

    @property
    def max_feed_tokens(self) -> int:
        """Most tokens one step may evaluate, all sequences together."""
        ...

    @property
    def chat_template(self) -> ChatTemplate | None:
        """The chat template the model ships, if any."""
        ...

    @property
    def add_bos(self) -> bool:
        """Whether the model's tokenizer wants a BOS token in front of a prompt."""
        ...

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        """Token ids for `text`."""
        ...

    def token_bytes(self, token: int) -> bytes:
        """The bytes one token stands for (empty for control tokens)."""
        ...

    def is_end_of_generation(self, token: int) -> bool:
        """Whether `token` ends a generation (EOS, EOT, ...)."""
        ...

    def open_slot(self, slot: int, params: SamplingParams) -> None:
        """Clear a slot's KV state and set up its sampler."""
        ...

    def close_slot(self, slot: int) -> None:
        """Free a slot's KV state and sampler."""
        ...

    def step(self, feeds: Sequence[Feed]) -> list[int | None]:
        """Evaluate every feed in one forward pass; a sampled token per feed that asked for one."""
        ...

    def close(self) -> None:
        """Release the model."""
        ...


class EngineError(Exception):
    """A request the engine could not run; `code` is the API error code."""

    def __init__(self, message: str, code: str = "engine_error") -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class TokenEvent:
    """What the engine sends back for a request: new text, and at the end why it stopped."""

    text: str
    token_ids: tuple[int, ...]
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    error: EngineError | None = None
