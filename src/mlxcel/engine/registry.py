"""Loaded models by served name, and the choice of backend for a model file."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import CollectorRegistry

from mlxcel.config import ServerConfig
from mlxcel.engine.metrics import EngineMetrics
from mlxcel.engine.prompt_cache import PromptCache
from mlxcel.engine.sampling import SamplingDefaults, model_defaults
from mlxcel.engine.scheduler import Scheduler, SchedulerLimits
from mlxcel.engine.types import ChatTemplate, TextGenerator

logger = logging.getLogger(__name__)

DEFAULT_MODEL_NAMES = frozenset({"default", ""})


class ModelNotFound(LookupError):
    """No loaded model answers to the requested name."""


@dataclass
class LoadedModel:
    """A model the server serves: its name, its backend and the thread that owns it."""

    name: str
    path: Path
    backend: str
    generator: TextGenerator
    scheduler: Scheduler
    defaults: SamplingDefaults
    chat_template: ChatTemplate | None
    """The model's own template, or the one --chat-template-file named."""


class ModelRegistry:
    """The models of this server; the first one is what `default` or no model means."""

    def __init__(self) -> None:
        self._models: dict[str, LoadedModel] = {}

    def add(self, model: LoadedModel) -> None:
        """Serve `model` under its name."""
        self._models[model.name] = model

    def all(self) -> list[LoadedModel]:
        """Every loaded model, first one first."""
        return list(self._models.values())

    def get(self, name: str | None) -> LoadedModel:
        """The model for a request's `model` field; None or 'default' means the first."""
        if name is None or name in DEFAULT_MODEL_NAMES:
            if not self._models:
                raise ModelNotFound("no model is loaded")
            return next(iter(self._models.values()))
        for model in self._models.values():
            if name in (model.name, str(model.path), model.path.name):
                return model
        raise ModelNotFound(f"the model '{name}' does not exist; see GET /v1/models")

    def close(self) -> None:
        """Stop every engine thread and free the models."""
        for model in self._models.values():
            model.scheduler.stop()
            model.generator.close()
        self._models.clear()


def choose_backend(model: Path, requested: str) -> str:
    """llama.cpp for a .gguf file, MLX for a model directory; `requested` may only agree."""
    natural = "mlx" if model.is_dir() else "llamacpp"
    if requested not in ("auto", natural):
        kind = "a model directory" if natural == "mlx" else "a GGUF file"
        raise ValueError(
            f"--backend {requested} cannot serve {model}, which is {kind}: "
            f"use --backend {natural} (or auto)"
        )
    return natural


def _open_llamacpp(config: ServerConfig) -> TextGenerator:
    from mlxcel.backends.llamacpp import LlamaCppGenerator, LlamaCppOptions

    options = LlamaCppOptions(
        ctx_size=config.ctx_size,
        threads=config.threads,
        parallel=config.parallel,
        batch_size=config.batch_size,
        ubatch_size=config.ubatch_size,
        verbose=config.log_level.lower() == "debug",
    )
    logger.info("loading %s with llama.cpp (%d threads)", config.model, config.threads)
    generator = LlamaCppGenerator(config.model, options)
    if config.warmup:
        generator.warm_up()
    return generator


def _open_mlx(config: ServerConfig) -> TextGenerator:
    from mlxcel.backends.mlx import MlxGenerator, MlxOptions

    options = MlxOptions(config.ctx_size, config.parallel, config.batch_size)
    logger.info("loading %s with MLX", config.model)
    generator = MlxGenerator(config.model, options)
    if config.warmup:
        generator.warm_up()
    return generator


def load_text_model(config: ServerConfig, metrics: EngineMetrics | None = None) -> LoadedModel:
    """Load the configured model on the backend its format calls for, and start its engine."""
    backend = choose_backend(config.model, config.backend)
    generator = _open_mlx(config) if backend == "mlx" else _open_llamacpp(config)
    limits = SchedulerLimits(config.queue_size, config.queue_timeout)
    engine_metrics = metrics or EngineMetrics(CollectorRegistry())
    scheduler = Scheduler(
        generator,
        limits=limits,
        name=config.served_name,
        metrics=engine_metrics.bind(config.served_name),
        prompt_cache=_prompt_cache(config),
    )
    scheduler.start()
    logger.info(
        "serving %s as '%s' (context %d per sequence, %d parallel)",
        config.model.name,
        config.served_name,
        generator.n_ctx_seq,
        generator.n_slots,
    )
    defaults = model_defaults(config.sampling_flags(), generator.generation_config)
    logger.info("sampling defaults: %s", defaults)
    label = "mlx" if backend == "mlx" else "llama.cpp"
    template = _chat_template(config, generator)
    return LoadedModel(
        config.served_name, config.model, label, generator, scheduler, defaults, template
    )


def _prompt_cache(config: ServerConfig) -> PromptCache | None:
    """The host-memory prompt cache --cache-ram asks for (MiB; -1 no limit, 0 none)."""
    if config.cache_ram_mib == 0:
        return None
    limit = -1 if config.cache_ram_mib < 0 else config.cache_ram_mib * 1024 * 1024
    return PromptCache(limit)


def _chat_template(config: ServerConfig, generator: TextGenerator) -> ChatTemplate | None:
    """The model's template, unless --chat-template-file replaces it (same special tokens)."""
    own = generator.chat_template
    if config.chat_template_file is None:
        return own
    source = config.chat_template_file.read_text()
    logger.info("chat template: %s", config.chat_template_file)
    return ChatTemplate(source, own.bos_token if own else "", own.eos_token if own else "")
