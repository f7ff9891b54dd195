"""The plain data a worker sends the HTTP process about its model and its streams: what the HTTP
process keeps of a model once it loads, the prompt it sends with media, and the error codes
both sides agree on. Everything here pickles."""

from __future__ import annotations

from dataclasses import dataclass

from mlxcel.backends.audio.speech import Voice
from mlxcel.engine.capabilities import DeviceInfo, FimTokens, KvCacheInfo
from mlxcel.engine.sampling import SamplingDefaults
from mlxcel.engine.types import ChatTemplate, SamplingParams
from mlxcel.media.audio import SentMedia

# The engine error code of a request whose model's worker died under it (a 503).
MODEL_UNAVAILABLE = "model_unavailable"
# The engine error code of a media prompt its worker could not lay out (a 400 about it).
MEDIA_PROMPT_REFUSED = "media_prompt_refused"

TextSequence = tuple[list[int], SamplingParams]
"""One sequence to generate: its prompt, and its sampling."""


@dataclass(frozen=True)
class MediaPrompt:
    """A rendered prompt with images or audio, in its text's order, as it goes to the model's
    worker to be laid out into tokens (and its media embedded) there."""

    text: str
    media: tuple[SentMedia, ...]


@dataclass(frozen=True)
class TextFacts:
    """What the HTTP process keeps of a loaded text model (sent once, when it loads)."""

    backend: str
    n_ctx_seq: int
    n_vocab: int
    n_slots: int
    batched: bool
    max_feed_tokens: int
    own_template: ChatTemplate | None
    generation_config: dict[str, float]
    add_bos: bool
    input_modalities: tuple[str, ...]
    media_marker: str | None
    """The text that stands for an image or clip in a prompt, for a model that reads media."""
    fim_tokens: FimTokens | None
    defaults: SamplingDefaults
    chat_template: ChatTemplate
    tool_call_parser: str
    kv_cache: KvCacheInfo | None
    """The KV cache's types and bytes, where the engine knows them (/props)."""
    longest_token: int
    """The most bytes of text one token stands for (serving/tokens.py's size check)."""
    audio_rate: int | None = None
    """Samples per second the model's audio projector takes (None: it takes no audio)."""
    devices: tuple[DeviceInfo, ...] = ()
    """The devices its layers sit on (RPC hosts among them), where the engine says."""
    scores_prompts: bool = False
    """Whether its engine scores prompts (`score_prompt`: echo with logprobs)."""


@dataclass(frozen=True)
class StreamEnd:
    """The last item of an iterator's stream: it ran out, or raised `error`."""

    error: BaseException | None = None


@dataclass(frozen=True)
class TranscriberFacts:
    """What the HTTP process keeps of a transcription model."""

    multilingual: bool
    parallel: int


@dataclass(frozen=True)
class SynthesizerFacts:
    """What the HTTP process keeps of a speech model: its voices as they were at load."""

    sample_rate: int
    default_voice: str
    voices: tuple[Voice, ...]
