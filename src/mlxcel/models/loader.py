"""A model config in, a loaded model out: the backend chosen, opened, warmed up, its engine
started, and its chat template, parsers and sampling defaults resolved once."""

from __future__ import annotations

import logging
from pathlib import Path

from mlxcel.config import ModelConfig
from mlxcel.engine.metrics import EngineMetrics
from mlxcel.engine.prompt_cache import PromptCache
from mlxcel.engine.sampling import model_defaults
from mlxcel.engine.scheduler import Scheduler, SchedulerLimits
from mlxcel.engine.types import ChatTemplate, TextGenerator
from mlxcel.models.loaded import LoadedModel
from mlxcel.parsers.tools import detect_parser
from mlxcel.serving.reasoning import reasoning_parser_name

logger = logging.getLogger(__name__)


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


def backend_label(config: ModelConfig) -> str:
    """The engine that serves (or will serve) a model, as /v1/models and /props name it."""
    return "mlx" if choose_backend(config.model, config.backend) == "mlx" else "llama.cpp"


def _open_llamacpp(config: ModelConfig) -> TextGenerator:
    from mlxcel.backends.llamacpp import LlamaCppGenerator, LlamaCppOptions

    options = LlamaCppOptions(
        ctx_size=config.ctx_size,
        threads=config.threads,
        parallel=config.parallel,
        batch_size=config.batch_size,
        ubatch_size=config.ubatch_size,
        verbose=config.verbose,
    )
    logger.info("loading %s with llama.cpp (%d threads)", config.model, config.threads)
    generator = LlamaCppGenerator(config.model, options)
    if config.warmup:
        generator.warm_up()
    return generator


def _open_mlx(config: ModelConfig) -> TextGenerator:
    from mlxcel.backends.mlx import MlxGenerator, MlxOptions

    options = MlxOptions(config.ctx_size, config.parallel, config.batch_size)
    logger.info("loading %s with MLX", config.model)
    generator = MlxGenerator(config.model, options)
    if config.warmup:
        generator.warm_up()
    return generator


def load_model(config: ModelConfig, metrics: EngineMetrics) -> LoadedModel:
    """Load a text model on the backend its format calls for, and start its engine."""
    backend = choose_backend(config.model, config.backend)
    generator = _open_mlx(config) if backend == "mlx" else _open_llamacpp(config)
    try:
        template = _chat_template(config, generator)
    except OSError:
        generator.close()
        raise
    name = config.served_name
    scheduler = Scheduler(
        generator,
        limits=SchedulerLimits(config.queue_size, config.queue_timeout),
        name=name,
        metrics=metrics.bind(name),
        prompt_cache=_prompt_cache(config),
    )
    scheduler.start()
    logger.info(
        "serving %s as '%s' (context %d per sequence, %d parallel)",
        config.model.name,
        name,
        generator.n_ctx_seq,
        generator.n_slots,
    )
    defaults = model_defaults(config.sampling_flags(), generator.generation_config)
    logger.info("[%s] sampling defaults: %s", name, defaults)
    source = template.source if template else ""
    tool_parser = config.tool_call_parser
    how = "configured"
    if tool_parser == "auto":
        tool_parser, how = detect_parser(source or None), "auto, from the chat template"
    logger.info("[%s] tool-call parser: %s (%s)", name, tool_parser, how)
    if config.reasoning_parser == "auto":
        # deepseek_r1 or qwen3 for <think> tags: decided per prompt, by who opens the tag.
        reasoning = reasoning_parser_name("auto", "", source) or "none"
        logger.info("[%s] reasoning parser: %s (auto, from the chat template)", name, reasoning)
    return LoadedModel(
        config, backend_label(config), generator, scheduler, defaults, template, tool_parser
    )


def _prompt_cache(config: ModelConfig) -> PromptCache | None:
    """The host-memory prompt cache --cache-ram asks for (MiB; -1 no limit, 0 none)."""
    if config.cache_ram_mib == 0:
        return None
    limit = -1 if config.cache_ram_mib < 0 else config.cache_ram_mib * 1024 * 1024
    return PromptCache(limit)


def _chat_template(config: ModelConfig, generator: TextGenerator) -> ChatTemplate | None:
    """The model's template, unless --chat-template-file replaces it (same special tokens)."""
    own = generator.chat_template
    if config.chat_template_file is None:
        return own
    source = config.chat_template_file.read_text()
    logger.info("chat template: %s", config.chat_template_file)
    return ChatTemplate(source, own.bos_token if own else "", own.eos_token if own else "")
