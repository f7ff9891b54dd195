"""A loaded model as the HTTP process serves it, and what it can do."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from mlxcel.config.engines import backend_label
from mlxcel.config.settings import Kind, ModelConfig
from mlxcel.engine.sampling import SamplingDefaults
from mlxcel.engine.types import ChatTemplate, TextModel
from mlxcel.models.adapters import AdapterTable
from mlxcel.models.audio import SpeechModel, TranscriptionModel
from mlxcel.models.encoders import EmbeddingModel, RerankModel
from mlxcel.models.images import ImageModel, served_image_model
from mlxcel.models.proxies import (
    RemoteEmbedder,
    RemoteReranker,
    RemoteSynthesizer,
    RemoteTranscriber,
)
from mlxcel.models.remote import Worker
from mlxcel.models.textgen import RemoteEngine, remote_text_model
from mlxcel.wire.facts import TextFacts

Capability = Literal[
    "text",
    "vision",
    "embedding",
    "rerank",
    "transcription",
    "speech",
    "image_generation",
    "image_edit",
]
TEXT: Capability = "text"
# What each capability is called in a message, and how a server gets a model that has it.
CAPABILITY_NAMES: dict[Capability, str] = {
    "text": "text generation",
    "vision": "image input",
    "embedding": "embeddings",
    "rerank": "reranking",
    "transcription": "transcription",
    "speech": "speech",
    "image_generation": "image generation",
    "image_edit": "image edits",
}
CAPABILITY_FLAGS: dict[Capability, str] = {
    "text": "-m",
    "vision": "--mmproj",
    "embedding": "--embedding-model",
    "rerank": "--reranker-model",
    "transcription": "--transcription-model",
    "speech": "--speech-model",
    "image_generation": "--image-model",
    "image_edit": "--image-model",
}

CAPABILITIES: dict[Kind, tuple[Capability, ...]] = {
    "text": ("text",),
    "vision": ("text", "vision"),
    "embedding": ("embedding",),
    "rerank": ("rerank",),
    "transcription": ("transcription",),
    "speech": ("speech",),
    "image": ("image_generation", "image_edit"),
}


@dataclass
class LoadedModel:
    """A model the server serves: its config, its worker process, the engine there as
    serving reaches it, and what routes need, resolved once at load."""

    config: ModelConfig
    worker: Worker
    backend: str
    generator: TextModel
    scheduler: RemoteEngine
    defaults: SamplingDefaults
    chat_template: ChatTemplate
    """The template its chats render with (the model's own unless a flag chose another)."""
    tool_call_parser: str
    """The parser for tool calls: the configured one, or with `auto` the template's."""
    adapters: AdapterTable = field(init=False)
    """Its LoRA adapters (its registry entry's table, shared)."""

    def __post_init__(self) -> None:
        self.adapters = AdapterTable(self.config)

    @property
    def name(self) -> str:
        """The served name."""
        return self.config.served_name

    @property
    def aliases(self) -> tuple[str, ...]:
        """Other names it answers to."""
        return self.config.names[1:]

    @property
    def names(self) -> tuple[str, ...]:
        """Every name it answers to, its id first."""
        return self.config.names

    @property
    def path(self) -> Path:
        """The weights: a GGUF file or a model directory."""
        return self.config.model

    @property
    def n_predict(self) -> int:
        """Tokens to generate when a request sets no limit (-1: until the context is full)."""
        return self.config.n_predict

    @property
    def reasoning_parser(self) -> str:
        """The reasoning parser setting (`auto` is decided per prompt, by who opens the tag)."""
        return self.config.reasoning_parser

    def close(self) -> None:
        """End the worker process: the engine stops and every byte of the model goes."""
        self.worker.stop()


def served_model(config: ModelConfig, worker: Worker, facts: TextFacts) -> LoadedModel:
    """The loaded model of a worker that has sent its facts."""
    return LoadedModel(
        config,
        worker,
        facts.backend,
        remote_text_model(worker, facts),
        RemoteEngine(worker),
        facts.defaults,
        facts.chat_template,
        facts.tool_call_parser,
    )


@dataclass
class LoadedEncoder:
    """An embedding or rerank model: its engine in its worker process, behind a batcher (in
    this process) shared by every request."""

    config: ModelConfig
    worker: Worker
    backend: str
    encoder: EmbeddingModel | RerankModel

    @property
    def name(self) -> str:
        """The served name."""
        return self.config.served_name

    def close(self) -> None:
        """Stop the batcher and end the worker process: every byte of the model goes."""
        self.encoder.close()


Loaded = LoadedModel | LoadedEncoder | TranscriptionModel | SpeechModel | ImageModel
"""What the registry holds for a loaded model, whatever its kind: each runs in a worker
process of its own."""


def served(config: ModelConfig, worker: Worker, facts: Any) -> Loaded:
    """The loaded model of a worker that has sent its facts, as its kind serves it."""
    name = config.served_name
    if config.kind == "image":
        return served_image_model(config, worker, facts)
    if config.kind == "transcription":
        engine = RemoteTranscriber(worker, facts)
        return TranscriptionModel(name, engine.parallel, engine=engine, worker=worker)
    if config.kind == "speech":
        return SpeechModel(
            name, config.parallel, engine=RemoteSynthesizer(worker, facts), worker=worker
        )
    budget = config.embedding_batch_tokens
    if config.kind == "embedding":
        embedder = EmbeddingModel(RemoteEmbedder(worker, facts), name, budget)
        return LoadedEncoder(config, worker, backend_label(config), embedder)
    if config.kind == "rerank":
        reranker = RerankModel(RemoteReranker(worker, facts), name, budget)
        return LoadedEncoder(config, worker, backend_label(config), reranker)
    return served_model(config, worker, facts)
