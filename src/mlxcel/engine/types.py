"""The seam between the engine and the backends: capability protocols and their data."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import numpy as np

from mlxcel.engine.adapters import AdapterSet
from mlxcel.engine.positions import MropePositions

DRY_BREAKERS = ("\n", ":", '"', "*")

# The stages of llama-server's sampler chain, by its names (`samplers`), in its default order.
# `top_n_sigma` is kept as a name only: its threshold is off unless set, and nothing sets it here.
SamplerStage = Literal[
    "penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature"
]
DEFAULT_SAMPLERS: tuple[SamplerStage, ...] = (
    "penalties",
    "dry",
    "top_k",
    "typ_p",
    "top_p",
    "min_p",
    "xtc",
    "temperature",
)


# How SamplingParams.grammar is written: GBNF (llama-server) or llguidance lark.
GrammarSyntax = Literal["gbnf", "lark"]


@dataclass(frozen=True)
class SamplingParams:
    """Per-request generation settings, already resolved against the server's defaults."""

    max_tokens: int
    temperature: float
    top_p: float
    top_k: int
    min_p: float
    seed: int | None = None
    typical_p: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    dry_multiplier: float = 0.0
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = -1
    dry_sequence_breakers: tuple[str, ...] = DRY_BREAKERS
    xtc_probability: float = 0.0
    xtc_threshold: float = 0.1
    p_less: bool = False
    """p-less sampling (arXiv 2509.23234): after temperature, keep the tokens at least as likely
    as the distribution's collision probability, sum(p**2)."""
    p_less_norm: bool = False
    """Its normalised variant: the threshold (V * sum(p**2) - 1) / (V - 1), V the candidates."""
    logit_bias: tuple[tuple[int, float], ...] = ()
    min_tokens: int = 0
    ignore_eos: bool = False
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    include_stop_str: bool = False
    logprobs: int | None = None
    """None: no log-probabilities; k >= 0: the sampled token's and the k most likely."""
    post_sampling_probs: bool = False
    """The log-probabilities are those the sampler chain left (llama-server's
    `post_sampling_probs`): over the candidates it kept, at its temperature; a greedy pick
    has probability 1. Candidates it dropped are not listed."""
    json_schema: str | None = None
    """Output must be JSON valid against this schema (JSON text)."""
    grammar: str | None = None
    """Output must match this grammar (llama-server's `grammar`)."""
    grammar_syntax: GrammarSyntax = "gbnf"
    """`gbnf`, or `lark`: llguidance's, whose `%json {...}` rules hold a whole JSON schema."""
    grammar_markers: tuple[str, ...] = ()
    """A lark grammar's markers, which it names as rules `marker_0` ... (engine/markers.py):
    defined by the engine as the special tokens they are in its vocabulary, else as text."""
    render_special: bool = False
    """Control tokens appear in the text (for parsers whose markers are control tokens)."""
    samplers: tuple[SamplerStage, ...] = DEFAULT_SAMPLERS
    """The truncation and temperature stages after logit bias, in order; a stage left out is
    not applied. Temperature <= 0 is greedy whatever the order."""
    mirostat: int = 0
    """1 or 2: Mirostat (after temperature) replaces the stages; 0: off."""
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.1
    t_max_predict_ms: float = 0.0
    """Once a newline is out, stop when generating has taken longer than this; 0: no limit."""
    cache_prompt: bool = True
    """Reuse a cached prefix of the prompt (False: evaluate it all)."""
    id_slot: int = -1
    """The slot to run in (-1: whichever suits)."""
    return_progress: bool = False
    """Send prompt-processing progress events while the prompt is evaluated."""
    adapters: AdapterSet = ()
    """The LoRA adapters it runs with and their scales (engine/adapters.py): part of what a
    cached prefix is keyed by, and what a replica router may route by."""


@dataclass(frozen=True)
class Sample:
    """A sampled token, with its log-probability and the top alternatives when asked for."""

    token: int
    logprob: float | None = None
    top: tuple[tuple[int, float], ...] = ()
    then: tuple[Sample, ...] = ()
    """With a draft: the tokens sampled at the draft's positions after this one, one per draft
    token accepted (the last of them is the model's own, where the draft was rejected)."""


@dataclass(frozen=True)
class MediaSpan:
    """An image's (or one audio window's) place in a prompt: where its tokens start, and their
    embedding rows.

    Its tokens in the prompt are one placeholder id (`placeholder`, negative, from the image's
    digest), so the prefix cache matches the same image at the same place and nothing else.
    """

    start: int
    embeddings: np.ndarray = field(compare=False, repr=False)
    """float32, one row per token of the image, the model's embedding width; on a model whose
    first layers add the image's features again (Qwen3-VL's deepstack), [tokens, 1 + those
    layers, width]."""
    digest: str
    mrope: MropePositions | None = field(default=None, compare=False, repr=False)
    """Its M-RoPE positions, on a model that places media on a grid (Qwen2-VL); None: its
    tokens take the next positions one by one, as text does."""

    @property
    def end(self) -> int:
        """The index after the image's last token."""
        return self.start + len(self.embeddings)

    @property
    def placeholder(self) -> int:
        """The token id the prompt holds at each of the image's positions."""
        return -1 - int(self.digest[:7], 16)


@dataclass(frozen=True)
class Feed:
    """Tokens to evaluate for one sequence in a step, and whether to sample after them.

    `media` are (offset into `tokens`, rows) for the images among them: those positions are
    evaluated from the rows, not from token ids. An image is never split across two feeds.
    """

    slot: int
    tokens: Sequence[int]
    sample: bool
    media: tuple[tuple[int, np.ndarray], ...] = ()
    mrope: tuple[MropePositions | None, ...] = ()
    """Each image's of `media` M-RoPE positions (MediaSpan.mrope); empty when none has any."""
    draft: Sequence[int] = ()
    """Tokens proposed to follow `tokens`, verified in the same pass (a generator that
    VerifiesDrafts); those not accepted leave the KV state."""


@dataclass(frozen=True)
class ChatTemplate:
    """A model's own chat template and the special tokens it refers to."""

    source: str
    bos_token: str
    eos_token: str
    defaults: Mapping[str, Any] = field(default_factory=dict, hash=False)
    """Variables the server gives it unless a request sets them (--reasoning and friends)."""


class TextModel(Protocol):
    """What serving reads of a text model: its tokenizer, its context and its slots."""

    @property
    def n_ctx_seq(self) -> int:
        """Tokens of context one sequence may use."""
        ...

    @property
    def n_vocab(self) -> int:
        """Tokens in the vocabulary."""
        ...

    @property
    def n_slots(self) -> int:
        """Sequences that can decode together."""
        ...

    @property
    def batched(self) -> bool:
        """Whether decoding sequences share one forward pass (else they step one at a time)."""
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
    def generation_config(self) -> Mapping[str, float]:
        """Sampling defaults the model ships (temperature, top_p, top_k, min_p, ...)."""
        ...

    @property
    def add_bos(self) -> bool:
        """Whether the model's tokenizer wants a BOS token in front of a prompt."""
        ...

    @property
    def input_modalities(self) -> tuple[str, ...]:
        """What a prompt may hold: "text", and "image" and "audio" where a projector takes them."""
        ...

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        """Token ids for `text`."""
        ...

    def token_pieces(self, tokens: Sequence[int], *, special: bool = False) -> list[bytes]:
        """The bytes each token stands for; control tokens are empty unless `special`."""
        ...


class TextGenerator(TextModel, Protocol):
    """A loaded text model that steps a batch of sequences, one slot per sequence."""

    def token_bytes(self, token: int, *, special: bool = False) -> bytes:
        """The bytes one token stands for; control tokens are empty unless `special`."""
        ...

    def is_end_of_generation(self, token: int) -> bool:
        """Whether `token` ends a generation (EOS, EOT, ...)."""
        ...

    def open_slot(self, slot: int, params: SamplingParams, *, reuse: int = 0) -> None:
        """Set up a slot's sampler, keeping the first `reuse` tokens of its KV state."""
        ...

    def close_slot(self, slot: int) -> None:
        """Free a slot's sampler; its KV state stays for a later request to reuse."""
        ...

    def step(self, feeds: Sequence[Feed]) -> list[Sample | None]:
        """Evaluate every feed in one forward pass; a sample per feed that asked for one."""
        ...

    def warm_up(self) -> None:
        """Run a token through the model so the first request does not pay the first-use cost."""
        ...

    def close(self) -> None:
        """Release the model."""
        ...


class EngineError(Exception):
    """A request the engine could not run; `code` is the API error code."""

    def __init__(self, message: str, code: str = "engine_error", param: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.param = param
        """The request field it is about, when it is the request's fault (a 400)."""

    def __reduce__(self) -> tuple[type[EngineError], tuple[str, str, str | None]]:
        # Keeps the code and field when the error crosses from a model's worker process.
        return type(self), (str(self), self.code, self.param)


# The log-probability OpenAI reports for a token that cannot come (one a grammar masks): a
# number where the engines have -inf, which JSON cannot carry.
IMPOSSIBLE_LOGPROB = -9999.0


def possible(logprob: float) -> float:
    """`logprob`, or IMPOSSIBLE_LOGPROB where it is lower (-inf, a masked token's) or NaN."""
    return logprob if logprob >= IMPOSSIBLE_LOGPROB else IMPOSSIBLE_LOGPROB


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token's log-probability, with its bytes and the top alternatives'."""

    token: int
    piece: bytes
    logprob: float
    top: tuple[tuple[int, bytes, float], ...] = ()


@dataclass(frozen=True)
class PromptProgress:
    """How far evaluating a prompt has got: tokens in all, found cached, evaluated so far."""

    total: int
    cache: int
    processed: int
    time_ms: float


@dataclass(frozen=True)
class TokenEvent:
    """What the engine sends back for a request: new text, and at the end why it stopped.

    `token_ids` are the tokens generated since the last event (an end-of-generation token that
    ended it excluded); the token counts are the request's so far. `stop_reason` refines a
    finish: "eos", "word" (a stop string, in `stop_word`), "token" (a stop token id) or "limit".
    `prompt_ms` is the time from admission to the first token, `predicted_ms` from there to
    this event; `slot` is where it runs. An event with `progress` reports prompt evaluation.
    `draft_tokens` and `draft_accepted` count speculative drafts so far.
    """

    text: str
    token_ids: tuple[int, ...]
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    error: EngineError | None = None
    logprobs: tuple[TokenLogprob, ...] = ()
    stop_reason: str | None = None
    stop_word: str | None = None
    cached_tokens: int = 0
    prompt_ms: float = 0.0
    predicted_ms: float = 0.0
    slot: int = -1
    progress: PromptProgress | None = None
    draft_tokens: int = 0
    """Speculative decoding: tokens drafted for this request so far, and how many of them the
    model accepted."""
    draft_accepted: int = 0
