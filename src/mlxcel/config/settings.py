"""Server configuration: one definition of every setting and its default.

`ServerConfig` is the process (listeners, keys, limits, logging, memory budget); each
`ModelConfig` in it is one model it serves, with everything that is per model.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

from mlxcel.backends.embeddings.layout import folder_layout, layout_modalities
from mlxcel.backends.group import DistributedConfig
from mlxcel.config.adapters import LoraAdapter
from mlxcel.config.cores import default_threads
from mlxcel.config.realtime import RealtimeConfig
from mlxcel.logs import LOG_FORMATS
from mlxcel.media.policy import MediaLimits, MediaPolicy
from mlxcel.mmproj import projector_modalities
from mlxcel.weights import hears

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
DEFAULT_CTX_SIZE = 4096
DEFAULT_N_PREDICT = -1
DEFAULT_PARALLEL = 1
DEFAULT_BATCH_SIZE = 512
DEFAULT_UBATCH_SIZE = 512
DEFAULT_QUEUE_SIZE = 64
# Requests beyond the least busy replica's that send a prompt elsewhere (docs/replicas.md).
DEFAULT_REPLICA_IMBALANCE = 4
DEFAULT_QUEUE_TIMEOUT = 600.0
DEFAULT_SHUTDOWN_TIMEOUT = 30.0
# Seconds a loaded worker may go without answering its heartbeat before it is killed.
DEFAULT_WORKER_TIMEOUT = 30.0
DEFAULT_CACHE_RAM_MIB = 2048
DEFAULT_CACHE_DISK_MAX = 10 * 1024**3
DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024
# Connection hygiene (api/connections.py): seconds, and open client connections.
DEFAULT_HEADER_TIMEOUT = 15.0
DEFAULT_BODY_TIMEOUT = 30.0
# A whole body, however steadily it trickles: 32 MiB (the body limit) at about 1 Mbit/s.
DEFAULT_BODY_DEADLINE = 300.0
DEFAULT_KEEP_ALIVE_TIMEOUT = 15
DEFAULT_MAX_CONNECTIONS = 1024
# How long, and within how many bytes in all, the images `response_format: url` links to are kept.
DEFAULT_IMAGE_URL_TTL = 3600.0
DEFAULT_IMAGE_URL_MAX_MIB = 256
# The most pixels one generated or edited image may have: OpenAI's largest size, 1536x1024
# (a 1024x1024 image took 150 s a step on a CPU here; 2048x2048 is four times that).
DEFAULT_IMAGE_MAX_PIXELS = 1536 * 1024
# Denoising steps of one image of the most pixels: with it, what one image request may cost.
DEFAULT_IMAGE_MAX_STEPS = 50
DEFAULT_LOG_LEVEL = "info"
DEFAULT_BACKEND = "auto"
BACKENDS = ("auto", "llamacpp", "mlx", "transformers")
# llama.cpp's KV cache data types (-ctk/-ctv), by ggml's names; f16 is its default.
KV_CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
DEFAULT_KV_CACHE_TYPE = "f16"
# Speculative decoding (llama-server's --spec-type names): off, or prompt lookup.
SPEC_TYPES = ("none", "ngram-simple")
DEFAULT_SPEC_NGRAM_SIZE_N = 12
DEFAULT_DRAFT_MAX = 48
DEFAULT_DRAFT_MIN = 0
API_KEY_ENV = "MLXCEL_API_KEY"
# Side models' request limits and their shared-batch size (tokens per forward pass).
DEFAULT_EMBEDDING_MAX_INPUTS = 2048
DEFAULT_EMBEDDING_MAX_TOKENS = 300_000
DEFAULT_RERANK_MAX_DOCUMENTS = 1000
DEFAULT_EMBEDDING_BATCH_TOKENS = 8192
# Longer uploads to the transcription routes are a 400 (an hour: what one request may hold a
# worker for).
DEFAULT_MAX_AUDIO_SECONDS = MediaLimits().max_audio_seconds
# The engine of an embedding or rerank model folder (a GGUF always runs on llama.cpp); auto is
# ONNX Runtime on Linux, where bench/embeddings.py measured it ahead of torch, MLX
# (mlx-embeddings) for embeddings on Apple Silicon or an MLX-quantized folder, else torch.
ENCODER_ENGINES = ("auto", "onnxruntime", "torch", "mlx")

Kind = Literal["text", "vision", "embedding", "rerank", "transcription", "speech", "image"]
KINDS: tuple[Kind, ...] = (
    "text",
    "vision",
    "embedding",
    "rerank",
    "transcription",
    "speech",
    "image",
)
# The kinds this build can serve; the capability issues add to it.
SERVABLE_KINDS: frozenset[Kind] = frozenset(
    {"text", "vision", "embedding", "rerank", "transcription", "speech", "image"}
)
# What each kind is called where a user reads it.
KIND_NAMES: dict[Kind, str] = {
    "text": "text generation",
    "vision": "vision (multimodal)",
    "embedding": "embeddings",
    "rerank": "reranking",
    "transcription": "transcription",
    "speech": "speech",
    "image": "image generation",
}


def kv_cache_problem(cache_type_v: str, flash_attn: str) -> str | None:
    """Why llama.cpp would refuse a V cache type with this flash attention setting, or None:
    a quantized V cache needs flash attention."""
    if cache_type_v not in ("f32", "f16", "bf16") and flash_attn == "off":
        return (
            f"--cache-type-v {cache_type_v} needs flash attention: "
            "use --flash-attn on or auto, or an f16 V cache"
        )
    return None


def speculation_problem(
    size_n: int,
    draft_max: int,
    draft_min: int,
    model_draft: Path | None = None,
    spec_type: str = "none",
) -> str | None:
    """What is wrong with speculative decoding settings, or None."""
    if model_draft is not None:
        if not model_draft.is_file():
            return f"--model-draft {model_draft}: no such file"
        if spec_type != "none":
            return f"--spec-type {spec_type} and --model-draft: choose one way to draft"
    if not 1 <= size_n <= 1024:
        return f"--spec-ngram-simple-size-n must be between 1 and 1024, got {size_n}"
    if draft_max < 1:
        return f"--draft-max must be at least 1, got {draft_max}"
    if not 0 <= draft_min <= draft_max:
        return f"--draft-min must be between 0 and --draft-max ({draft_max}), got {draft_min}"
    return None


@dataclass(frozen=True)
class ModelConfig:
    """One model the server serves: where it is, what it is called, and how it runs."""

    model: Path
    kind: Kind = "text"
    alias: str | None = None
    aliases: tuple[str, ...] = ()
    """More names the model answers to, beside its served name."""
    tags: tuple[str, ...] = ()
    """llama-server's --tags: labels /v1/models lists with the model, not used for routing."""
    hub_id: str | None = None
    backend: str = DEFAULT_BACKEND
    ctx_size: int = DEFAULT_CTX_SIZE
    n_predict: int = DEFAULT_N_PREDICT
    threads: int = field(default_factory=default_threads)
    threads_batch: int | None = None
    """Threads for prompt evaluation (llama-server's -tb); None: as many as `threads`."""
    parallel: int = DEFAULT_PARALLEL
    batch_size: int = DEFAULT_BATCH_SIZE
    ubatch_size: int = DEFAULT_UBATCH_SIZE
    queue_size: int = DEFAULT_QUEUE_SIZE
    queue_timeout: float = DEFAULT_QUEUE_TIMEOUT
    warmup: bool = True
    verbose: bool = False
    """The backend's own logging (llama.cpp's), as --log-level debug asks."""
    tool_call_parser: str = "auto"
    reasoning_parser: str = "auto"
    chat_template_file: Path | None = None
    cache_ram_mib: int = DEFAULT_CACHE_RAM_MIB
    cache_disk: Path | None = None
    cache_disk_max: int = DEFAULT_CACHE_DISK_MAX  # bytes
    slot_save_path: Path | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repeat_penalty: float | None = None
    p_less: bool = False
    p_less_norm: bool = False
    seed: int | None = None
    reasoning: str = "auto"
    chat_template: str | None = None
    chat_template_kwargs: Mapping[str, Any] = field(default_factory=dict, hash=False)
    jinja: bool = True
    n_gpu_layers: int | None = None
    # llama.cpp RPC hosts the layers spread over, their shares, the keyed channel's key.
    rpc: tuple[str, ...] = ()
    tensor_split: tuple[float, ...] = ()
    rpc_key_file: Path | None = None
    flash_attn: str = "auto"
    mmap: bool = True
    mlock: bool = False
    embedding_batch_tokens: int = DEFAULT_EMBEDDING_BATCH_TOKENS
    """Tokens one shared forward pass of an embedding or rerank model may hold."""
    embedding_engine: str = "auto"
    """The engine of an embedding or rerank model folder (ENCODER_ENGINES)."""
    mmproj: Path | None = None
    """A vision projector GGUF for a GGUF model (--mmproj): the model then reads images."""
    cache_type_k: str = DEFAULT_KV_CACHE_TYPE
    """llama.cpp's KV cache data type for K (KV_CACHE_TYPES)."""
    cache_type_v: str = DEFAULT_KV_CACHE_TYPE
    """And for V; a quantized V needs flash attention (on or auto)."""
    spec_type: str = "none"
    """Speculative decoding: `ngram-simple` drafts by prompt lookup (SPEC_TYPES)."""
    spec_ngram_size_n: int = DEFAULT_SPEC_NGRAM_SIZE_N
    """Tokens of the n-gram looked up earlier in the sequence."""
    draft_max: int = DEFAULT_DRAFT_MAX
    """Most tokens drafted per step."""
    draft_min: int = DEFAULT_DRAFT_MIN
    """A shorter draft is not verified."""
    draft_cost: float | None = None
    """What verifying a drafted token costs, as a share of a one-token decode; None: measured
    at load."""
    model_draft: Path | None = None
    """A draft model GGUF of the same vocabulary (-md): it drafts for speculative decoding."""
    on_demand: bool = False
    """Load on the first request, not at startup."""
    idle_timeout: float = 0.0
    """Unload after this many seconds with no request running or queued; 0 = never."""
    pinned: bool = False
    """Never unloaded for idleness or to make room."""
    lora_adapters: tuple[LoraAdapter, ...] = ()
    """LoRA adapters loaded over it (config/adapters.py; docs/lora.md)."""
    lora_init_without_apply: bool = False
    """Its adapters start at global scale 0: a request (or POST /lora-adapters) applies them."""
    distributed: DistributedConfig | None = None
    """Split over the machines of a group (--distributed): this process is rank 0."""
    replicas: int = 1
    """Worker processes serving the model, each with its own engine and caches."""
    replica_routing: str = "prefix"  # or round-robin (engine/replica_router.py)
    replica_imbalance: int = DEFAULT_REPLICA_IMBALANCE
    autoscaling: Mapping[str, float] = field(default_factory=dict, hash=False)
    """On a Ray cluster (--ray): min_replicas, max_replicas, target_ongoing_requests."""
    ray_actor_options: Mapping[str, Any] = field(default_factory=dict, hash=False)
    """On a Ray cluster: each replica's num_cpus, num_gpus and resources (config/ray_keys.py)."""

    @property
    def input_modalities(self) -> tuple[str, ...]:
        """What its prompts may hold, as /v1/models lists it (a projector's, from its header)."""
        if self.mmproj is not None:
            return ("text", *projector_modalities(self.mmproj))
        if self.kind == "embedding":
            return layout_modalities(self.model)
        if self.kind != "vision":
            return ("text",)
        return ("text", "image", "audio") if hears(self.model) else ("text", "image")

    @property
    def multi_vector(self) -> bool:
        """An embedding model that answers a matrix per input (late interaction, ColBERT)."""
        return self.kind == "embedding" and folder_layout(self.model) == "late-interaction"

    def sampling_flags(self) -> dict[str, float | None]:
        """The sampling defaults set by flag or config (None: not set)."""
        return {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "min_p": self.min_p,
            "repeat_penalty": self.repeat_penalty,
            "p_less": self.p_less or None,
            "p_less_norm": self.p_less_norm or None,
        }

    def llamacpp_only_flags(self) -> list[str]:
        """The flags set that only the llama.cpp backend acts on."""
        flags = {
            "--n-gpu-layers": self.n_gpu_layers is not None,
            "--rpc": bool(self.rpc),
            "--tensor-split": bool(self.tensor_split),
            "--flash-attn": self.flash_attn != "auto",
            "--no-mmap": not self.mmap,
            "--mlock": self.mlock,
            "--cache-type-k": self.cache_type_k != DEFAULT_KV_CACHE_TYPE,
            "--cache-type-v": self.cache_type_v != DEFAULT_KV_CACHE_TYPE,
            "--spec-type": self.spec_type != "none",
            "--model-draft": self.model_draft is not None,
        }
        return [flag for flag, given in flags.items() if given]

    def kv_cache_problem(self) -> str | None:
        """Why llama.cpp would refuse these KV cache settings, or None."""
        return kv_cache_problem(self.cache_type_v, self.flash_attn)

    def template_defaults(self) -> dict[str, Any]:
        """What chat templates get unless a request sets it: --chat-template-kwargs, and
        `enable_thinking` from --reasoning (true for auto, as llama-server passes it)."""
        defaults = dict(self.chat_template_kwargs)
        if self.reasoning != "auto" or "enable_thinking" not in defaults:
            defaults["enable_thinking"] = self.reasoning != "off"
        return defaults

    @cached_property
    def served_name(self) -> str:
        """The model id clients see: the first --alias (comma-separated), else the hub id,
        file stem or directory name (kept: every streamed chunk names it)."""
        named = next((a.strip() for a in (self.alias or "").split(",") if a.strip()), None)
        if named or self.hub_id:
            return named or str(self.hub_id)
        # A directory's name is kept whole: "Qwen2.5-0.5B" has no suffix to drop.
        return self.model.stem if self.model.suffix.lower() == ".gguf" else self.model.name

    @property
    def given_names(self) -> tuple[str, ...]:
        """The names given to the model (--alias's, then `aliases`), as /v1/models lists them
        in `aliases`: its id among them when it is one, as llama-server lists them."""
        given = tuple(a.strip() for a in (self.alias or "").split(",") if a.strip())
        return tuple(dict.fromkeys((*given, *self.aliases)))

    @property
    def names(self) -> tuple[str, ...]:
        """Every name the model answers to, its served name first, then the names given."""
        return tuple(dict.fromkeys((self.served_name, *self.given_names)))


@dataclass(frozen=True)
class ServerConfig:
    """The process `mlxcel serve` runs: its listeners, keys, limits, logging and models."""

    models: tuple[ModelConfig, ...]
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    ollama_port: int | None = None
    """A second TCP port on the same hosts (--ollama-port), for clients built for Ollama's."""
    socket: Path | None = None
    api_keys: tuple[str, ...] = ()
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    log_level: str = DEFAULT_LOG_LEVEL
    log_format: str = LOG_FORMATS[0]
    webui: bool = True
    strict_model_names: bool = False
    cors_origins: tuple[str, ...] = ()
    config_file: Path | None = None
    """The YAML file the models came from, if any."""
    max_memory: int | None = None
    """Bytes the loaded models may hold together (None: no budget)."""
    embedding_max_inputs: int = DEFAULT_EMBEDDING_MAX_INPUTS
    """Inputs one embedding request may hold (413 past it)."""
    embedding_max_tokens: int = DEFAULT_EMBEDDING_MAX_TOKENS
    """Tokens one embedding or rerank request may hold, all inputs together."""
    rerank_max_documents: int = DEFAULT_RERANK_MAX_DOCUMENTS
    """Documents one rerank request may hold."""
    max_audio_seconds: float = DEFAULT_MAX_AUDIO_SECONDS
    """Seconds of audio one transcription or translation may hold (400 past it)."""

    media: MediaPolicy = field(default_factory=MediaPolicy)
    """Where request images may come from, and their limits."""
    shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT
    """Seconds requests in flight may take to finish after SIGTERM or SIGINT."""
    worker_timeout: float = DEFAULT_WORKER_TIMEOUT
    """Seconds a loaded model's worker may go without answering its heartbeat before it is
    killed and the model fails (0: never)."""
    exit_on_stdin_close: bool = False
    """Shut down when standard input reaches end of file (how a managed server follows its
    parent)."""
    remove_socket_dir: bool = False
    """At exit, remove the socket file's directory if it is empty (the managed client's)."""
    header_timeout: float = DEFAULT_HEADER_TIMEOUT
    body_timeout: float = DEFAULT_BODY_TIMEOUT
    body_deadline: float = DEFAULT_BODY_DEADLINE
    """Seconds a whole request body may take to arrive, from its first byte's turn."""
    keep_alive_timeout: int = DEFAULT_KEEP_ALIVE_TIMEOUT
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    allowed_hosts: tuple[str, ...] = ()
    """Host header names accepted beside the bound address and loopback names ('*': any)."""
    allow_downloads: bool = False
    """POST /models/pull, DELETE /models/NAME and /models/load with a path (--allow-downloads)."""
    public_openapi: bool = False
    """Serve /openapi.json without the API key."""
    image_url_ttl: float = DEFAULT_IMAGE_URL_TTL
    """Seconds an image answered by `url` stays at its link."""
    image_url_max_mib: int = DEFAULT_IMAGE_URL_MAX_MIB
    """MiB the linked images may take together; the oldest go first past it."""
    image_max_pixels: int = DEFAULT_IMAGE_MAX_PIXELS
    """Pixels one generated or edited image may have (400 naming `size` past it)."""
    image_max_steps: int = DEFAULT_IMAGE_MAX_STEPS
    """With image_max_pixels, the work one image request may ask for: images x steps x
    pixels at most image_max_pixels x image_max_steps."""
    realtime: RealtimeConfig = field(default_factory=RealtimeConfig)
    """/v1/realtime sessions: the models they join and their limits."""
    ray_address: str | None = None
    """The Ray cluster replicated models are served on (--ray, a config file's `ray:`)."""
    ray_start_timeout: float = 300.0
    """Seconds a model's replicas on Ray have to serve before the model fails (0: no limit)."""

    @property
    def hosts(self) -> tuple[str, ...]:
        """The addresses `host` names: one, or several with commas (llama-server's
        `--host 127.0.0.1,::1`), each listened on."""
        return tuple(h.strip() for h in self.host.split(",") if h.strip()) or (self.host,)
