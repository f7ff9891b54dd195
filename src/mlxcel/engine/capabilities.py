"""What a generator may do beyond the TextGenerator protocol, each asked with isinstance:
report its KV cache, verify drafts, draft with a model, save a slot's state, fill in the
middle, score a prompt."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from mlxcel.engine.adapters import AdapterSet
from mlxcel.engine.speculative import DraftCosts
from mlxcel.engine.types import Sample, TokenLogprob


@dataclass(frozen=True)
class KvCacheInfo:
    """A model's KV cache: its K and V data types, tokens it holds, and bytes of each."""

    type_k: str
    type_v: str
    cells: int
    k_bytes: int
    v_bytes: int


@runtime_checkable
class ReportsKvCache(Protocol):
    """A generator that may know its KV cache's types and size (/props shows them)."""

    @property
    def kv_cache(self) -> KvCacheInfo | None:
        """The KV cache as allocated when the model loaded (None: the engine does not say)."""
        ...


@dataclass(frozen=True)
class DeviceInfo:
    """A device a model's layers sit on: the local CPU, a GPU, or a remote RPC host."""

    name: str
    description: str
    """What the device is; for an RPC device, the host the user named."""
    layers: int
    """Repeating layers and the output layer placed on it, as the backend assigned them."""
    memory_bytes: int


@runtime_checkable
class ReportsDevices(Protocol):
    """A generator that knows which devices its layers went to (/props, /v1/models)."""

    @property
    def devices(self) -> tuple[DeviceInfo, ...]:
        """The devices, in the backend's order; empty where it does not say."""
        ...


@runtime_checkable
class VerifiesDrafts(Protocol):
    """A generator whose step can verify a feed's draft tokens (speculative decoding)."""

    @property
    def verifies_drafts(self) -> bool:
        """Whether Feed.draft may be set."""
        ...

    def draft_costs(self, lengths: Sequence[int]) -> DraftCosts:
        """What verifying a draft of each of these lengths costs, in one-token decodes
        (measured; called before the engine thread starts)."""
        ...


@runtime_checkable
class DraftsWithModel(Protocol):
    """A generator with a draft model of its own vocabulary (speculative decoding)."""

    @property
    def drafts_with_model(self) -> bool:
        """Whether `draft` may be called."""
        ...

    def draft(self, requests: Sequence[tuple[int, Sequence[int], int]]) -> list[tuple[int, ...]]:
        """For each (slot, its tokens so far, most tokens to draft): the draft model's greedy
        draft of what follows, every slot in the same decodes."""
        ...


@runtime_checkable
class SavesState(Protocol):
    """A generator that can copy a slot's KV state out to host memory and back."""

    @property
    def can_save_state(self) -> bool:
        """Whether this model's KV state can be saved (fixed when it loads)."""
        ...

    def save_state(self, slot: int) -> bytes:
        """The slot's KV state as bytes."""
        ...

    def load_state(self, slot: int, data: bytes) -> bool:
        """Put saved state into a slot (replacing what it held); False if it did not fit."""
        ...


@runtime_checkable
class SharesPrefixes(Protocol):
    """A generator that copies what one slot holds into another while the first runs on."""

    @property
    def shares_prefixes(self) -> bool:
        """Whether this model's slots can be copied (fixed when it loads)."""
        ...

    def copy_slot(self, source: int, slot: int) -> None:
        """Make `slot` hold what `source` holds now (replacing what it held); the copy is
        trimmed when the slot opens, to the prefix its request shares."""
        ...


@dataclass(frozen=True)
class FimTokens:
    """A vocabulary's fill-in-the-middle tokens; None where it has no such token.

    `repo` and `separator` mark repository-level context (the project, then each file).
    """

    prefix: int | None
    suffix: int | None
    middle: int | None
    repo: int | None = None
    separator: int | None = None


@runtime_checkable
class FillsInTheMiddle(Protocol):
    """A generator that knows its model's FIM tokens (a GGUF declares them)."""

    @property
    def fim_tokens(self) -> FimTokens:
        """The model's FIM tokens, read when it loaded."""
        ...


@runtime_checkable
class ScoresPrompts(Protocol):
    """A generator that can score a prompt: each token's log-probability after the tokens
    before it (legacy completions' `echo` with `logprobs`)."""

    @property
    def scores_prompts(self) -> bool:
        """Whether `score_prompt` may be called (fixed when the model loads)."""
        ...

    def score_prompt(self, slot: int, tokens: Sequence[int], top_n: int) -> list[Sample]:
        """For each token after the first, its log-probability given those before it and its
        `top_n` most likely rivals (Sample.token is the prompt's token). Evaluated into free
        slot `slot`, whose KV state then holds exactly `tokens` (on the engine thread)."""
        ...


@runtime_checkable
class GivesPromptScores(Protocol):
    """A text model as serving reaches it (models/textgen.py) whose engine scores prompts."""

    @property
    def scores_prompts(self) -> bool:
        """Whether `score_prompt` may be called."""
        ...

    def score_prompt(
        self, tokens: Sequence[int], top_n: int, adapters: AdapterSet
    ) -> list[TokenLogprob]:
        """Each prompt token's log-probability after those before it, from the second on,
        with its `top_n` rivals, the model running `adapters`."""
        ...
