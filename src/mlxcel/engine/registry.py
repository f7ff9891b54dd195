"""Loaded models by served name, and the choice of backend for a model file."""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path

from prometheus_client import CollectorRegistry

from mlxcel.chat_templates import BUILTIN_TEMPLATES, CHATML, builtin_for
from mlxcel.config import ServerConfig
from mlxcel.engine.metrics import EngineMetrics
from mlxcel.engine.prompt_cache import PromptCache
from mlxcel.engine.sampling import SamplingDefaults, model_defaults
from mlxcel.engine.scheduler import Scheduler, SchedulerLimits
from mlxcel.engine.types import ChatTemplate, TextGenerator
from mlxcel.progress import progress

logger = logging.getLogger(__name__)

DEFAULT_MODEL_NAMES = frozenset({"default", ""})
# Unknown model names logged (each once) before the log stops naming new ones.
_LOGGED_STAND_INS = 64


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
    """The template its chats render with (the model's own unless a flag chose another)."""
    aliases: tuple[str, ...] = ()
    """Other names it answers to (--alias a,b: `name` is a, `aliases` b)."""

    @property
    def names(self) -> tuple[str, ...]:
        """Every name it answers to, its id first."""
        return (self.name, *self.aliases)


class ModelRegistry:
    """The models of this server; the first one is what `default` or no model means.

    With one model served, a request naming a model it does not know (a client's hard-coded
    "gpt-4o") is served by it, unless `strict_names` asks for 404 instead.
    """

    def __init__(self, *, strict_names: bool = False) -> None:
        self._models: dict[str, LoadedModel] = {}
        self._strict = strict_names
        self._stand_ins: set[str] = set()

    def add(self, model: LoadedModel) -> None:
        """Serve `model` under its name."""
        self._models[model.name] = model

    def all(self) -> list[LoadedModel]:
        """Every loaded model, first one first."""
        return list(self._models.values())

    def named(self, name: str) -> LoadedModel | None:
        """The model with this name (or alias, file path or file name), if one is loaded."""
        for model in self._models.values():
            if name in (*model.names, str(model.path), model.path.name):
                return model
        return None

    def served(self) -> str:
        """The served names, for an error message."""
        names = [name for model in self._models.values() for name in model.names]
        return f"served: {', '.join(names) or 'none'} (see GET /v1/models)"

    def get(self, name: str | None) -> LoadedModel:
        """The model for a request's `model` field; None or 'default' means the first."""
        if name is None or name in DEFAULT_MODEL_NAMES:
            if not self._models:
                raise ModelNotFound("no model is loaded")
            return next(iter(self._models.values()))
        model = self.named(name)
        if model is not None:
            return model
        if self._strict or len(self._models) != 1:
            raise ModelNotFound(f"the model '{name}' does not exist; {self.served()}")
        only = next(iter(self._models.values()))
        if name not in self._stand_ins and len(self._stand_ins) < _LOGGED_STAND_INS:
            self._stand_ins.add(name)
            logger.info(
                "requests for model '%s' are served by '%s' (--strict-model-names: 404 instead)",
                name,
                only.name,
            )
        return only

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
        n_gpu_layers=config.n_gpu_layers,
        flash_attn=config.flash_attn,
        mmap=config.mmap,
        mlock=config.mlock,
    )
    logger.info("loading %s with llama.cpp (%d threads)", config.model, config.threads)
    with progress(f"loading {config.model.name}"):
        return LlamaCppGenerator(config.model, options)


def _open_mlx(config: ServerConfig) -> TextGenerator:
    from mlxcel.backends.mlx import MlxGenerator, MlxOptions

    options = MlxOptions(config.ctx_size, config.parallel, config.batch_size)
    ignored = config.llamacpp_only_flags()
    if ignored:
        logger.warning("%s: no effect on the MLX backend (llama.cpp flags)", ", ".join(ignored))
    logger.info("loading %s with MLX", config.model)
    with progress(f"loading {config.model.name}"):
        return MlxGenerator(config.model, options)


def load_text_model(config: ServerConfig, metrics: EngineMetrics | None = None) -> LoadedModel:
    """Load the configured model on the backend its format calls for, and start its engine."""
    backend = choose_backend(config.model, config.backend)
    generator = _open_mlx(config) if backend == "mlx" else _open_llamacpp(config)
    if config.warmup:
        with progress("warming up"):
            generator.warm_up()
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
    defaults = replace(
        model_defaults(config.sampling_flags(), generator.generation_config), seed=config.seed
    )
    logger.info("sampling defaults: %s", defaults)
    label = "mlx" if backend == "mlx" else "llama.cpp"
    template = _chat_template(config, generator)
    name, *aliases = config.served_names
    return LoadedModel(
        name, config.model, label, generator, scheduler, defaults, template, tuple(aliases)
    )


def _prompt_cache(config: ServerConfig) -> PromptCache | None:
    """The host-memory prompt cache --cache-ram asks for (MiB; -1 no limit, 0 none)."""
    if config.cache_ram_mib == 0:
        return None
    limit = -1 if config.cache_ram_mib < 0 else config.cache_ram_mib * 1024 * 1024
    return PromptCache(limit)


def _chat_template(config: ServerConfig, generator: TextGenerator) -> ChatTemplate:
    """The template chats render with, the server's template variables attached:
    --chat-template-file's, --chat-template's (a built-in's name, or Jinja), with --no-jinja
    the built-in of the model's format, else the model's own (ChatML if it has none)."""
    own = generator.chat_template
    source = own.source if own else None
    if config.chat_template_file is not None:
        source = config.chat_template_file.read_text()
        logger.info("chat template: %s", config.chat_template_file)
    elif config.chat_template is not None:
        name = config.chat_template
        source = BUILTIN_TEMPLATES.get(name, name)
        logger.info(
            "chat template: %s", f"built-in {name}" if name in BUILTIN_TEMPLATES else "given"
        )
    elif not config.jinja:
        name = builtin_for(source)
        source = BUILTIN_TEMPLATES[name]
        logger.info("chat template: built-in %s (--no-jinja)", name)
    elif source is None:
        logger.info("chat template: none in the model, ChatML")
    bos, eos = (own.bos_token, own.eos_token) if own else ("", "")
    return ChatTemplate(source or CHATML, bos, eos, config.template_defaults())
