"""A model config in, a loaded text engine out (in the model's worker process): the backend
chosen, opened and warmed up on its engine thread, and its chat template, parsers and sampling
defaults resolved once. The other kinds open in their workers through `worker/services.py`."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, replace

from mlxcel.chat_templates import BUILTIN_TEMPLATES, CHATML, builtin_for
from mlxcel.config.engines import choose_backend
from mlxcel.config.settings import ModelConfig
from mlxcel.engine.adapters import SwitchesAdapters
from mlxcel.engine.cache_tiers import CacheTiers
from mlxcel.engine.capabilities import VerifiesDrafts
from mlxcel.engine.handle import TurnBatch
from mlxcel.engine.metrics import RecordsMetrics
from mlxcel.engine.sampling import SamplingDefaults, model_defaults
from mlxcel.engine.scheduler import Scheduler, SchedulerLimits
from mlxcel.engine.slot_files import SlotFiles
from mlxcel.engine.speculative import SpeculativeConfig, linear_costs, timed_lengths
from mlxcel.engine.types import ChatTemplate, TextGenerator
from mlxcel.parsers.reasoning import reasoning_parser_name
from mlxcel.parsers.tools import detect_parser
from mlxcel.progress import progress
from mlxcel.worker.prompt_store import open_prompt_cache
from mlxcel.worker.rpc_links import rpc_endpoints

logger = logging.getLogger(__name__)

OnBroken = Callable[[str], None]
"""Called (from any thread) when a model split over machines lost a rank, with the reason."""


def _open_llamacpp(config: ModelConfig) -> TextGenerator:
    from mlxcel.backends.llamacpp import LlamaCppGenerator, LlamaCppOptions

    if config.kind == "vision" and config.mmproj is None:
        raise ValueError(f"{config.model}: a vision GGUF model needs its projector (mmproj)")

    options = LlamaCppOptions(
        ctx_size=config.ctx_size,
        threads=config.threads,
        threads_batch=config.threads_batch or config.threads,
        parallel=config.parallel,
        batch_size=config.batch_size,
        ubatch_size=config.ubatch_size,
        verbose=config.verbose,
        n_gpu_layers=config.n_gpu_layers,
        flash_attn=config.flash_attn,
        mmap=config.mmap,
        mlock=config.mlock,
        mmproj=config.mmproj,
        cache_type_k=config.cache_type_k,
        cache_type_v=config.cache_type_v,
        model_draft=config.model_draft,
        rpc=rpc_endpoints(config),
        tensor_split=config.tensor_split,
    )
    logger.info("loading %s with llama.cpp (%d threads)", config.model, config.threads)
    with progress(f"loading {config.model.name}"):
        return LlamaCppGenerator(config.model, options)


def _open_mlx(config: ModelConfig) -> TextGenerator:
    from mlxcel.backends.mlx import MlxGenerator, MlxOptions

    if config.mmproj is not None:
        raise ValueError(
            f"{config.model}: --mmproj is for GGUF models; an MLX vision model (mlx-vlm) "
            "holds its vision tower in its own folder (kind: vision)"
        )
    options = MlxOptions(config.ctx_size, config.parallel, config.batch_size)
    ignored = config.llamacpp_only_flags()
    if ignored:
        logger.warning("%s: no effect on the MLX backend (llama.cpp flags)", ", ".join(ignored))
    logger.info("loading %s with MLX", config.model)
    with progress(f"loading {config.model.name}"):
        if config.kind == "vision":
            from mlxcel.backends.mlx.vision import MlxVisionGenerator

            return MlxVisionGenerator(config.model, options)
        return MlxGenerator(config.model, options)


def _open_transformers(config: ModelConfig) -> TextGenerator:
    from mlxcel.backends.transformers import TransformersOptions, TransformersVisionGenerator

    if config.kind != "vision":
        raise ValueError(
            f"{config.model}: the transformers backend serves vision-language folders "
            "(kind: vision); serve a text model on MLX or as a GGUF"
        )
    options = TransformersOptions(
        config.ctx_size, config.parallel, config.batch_size, config.threads
    )
    logger.info("loading %s with transformers (%d threads)", config.model, config.threads)
    with progress(f"loading {config.model.name}"):
        return TransformersVisionGenerator(config.model, options)


def _open_group(config: ModelConfig, on_broken: OnBroken) -> TextGenerator:
    """Rank 0 of a model split over machines (`backends/mlx/leader.py`)."""
    from mlxcel.backends.mlx import MlxOptions
    from mlxcel.backends.mlx.leader import LeaderGenerator

    group = config.distributed
    assert group is not None  # the command line checked it is an MLX text model
    options = MlxOptions(config.ctx_size, config.parallel, config.batch_size)
    level = "debug" if config.verbose else "info"
    logger.info("loading %s with MLX over %s", config.model, group.hostfile)
    with progress(f"loading {config.model.name} over the group"):
        return LeaderGenerator(config.model, options, group, on_broken, level)


_OPENERS = {"mlx": _open_mlx, "llamacpp": _open_llamacpp, "transformers": _open_transformers}


@dataclass
class TextEngine:
    """A text model's engine, in its worker process: the generator, the scheduler that owns
    it, and what routes need, resolved once."""

    generator: TextGenerator
    scheduler: Scheduler
    defaults: SamplingDefaults
    chat_template: ChatTemplate
    """The template its chats render with (the model's own unless a flag chose another)."""
    tool_call_parser: str
    """The parser for tool calls: the configured one, or with `auto` the template's."""
    slot_files: SlotFiles | None = None
    """llama-server's slot save and restore, with --slot-save-path."""
    prompt_cache: CacheTiers | None = None

    def close(self) -> None:
        """Stop the engine thread and free the weights."""
        self.scheduler.stop()
        self.generator.close()


def load_text_engine(
    config: ModelConfig, metrics: RecordsMetrics, on_broken: OnBroken, batch: TurnBatch
) -> TextEngine:
    """Load a text or vision model on the backend its format calls for, on the thread that
    then runs its engine (`Scheduler.run` says why one thread), and return it once loaded."""
    loaded: Future[TextEngine] = Future()
    name = f"engine-{config.served_name}"
    args = (config, metrics, on_broken, batch, loaded)
    threading.Thread(target=_engine, args=args, name=name, daemon=True).start()
    return loaded.result()


def _engine(
    config: ModelConfig,
    metrics: RecordsMetrics,
    on_broken: OnBroken,
    batch: TurnBatch,
    loaded: Future[TextEngine],
) -> None:
    """The engine thread's life: load the model, hand it over, then step it until stopped."""
    try:
        engine = _load(config, metrics, on_broken, batch)
    except BaseException as exc:
        loaded.set_exception(exc)
        return
    loaded.set_result(engine)
    engine.scheduler.run()


def _load(
    config: ModelConfig, metrics: RecordsMetrics, on_broken: OnBroken, batch: TurnBatch
) -> TextEngine:
    backend = choose_backend(config.model, config.backend)
    if config.distributed is not None:
        generator = _open_group(config, on_broken)
    else:
        generator = _OPENERS[backend](config)
    try:
        _load_adapters(config, generator)
        if config.warmup:
            with progress("warming up"):
                generator.warm_up()
        template = _chat_template(config, generator)
    except (OSError, ValueError):
        generator.close()
        raise
    name = config.served_name
    prompt_cache, slot_files = open_prompt_cache(config, backend, generator)
    scheduler = Scheduler(
        generator,
        limits=SchedulerLimits(config.queue_size, config.queue_timeout),
        name=name,
        metrics=metrics,
        prompt_cache=prompt_cache,
        speculative=_speculative(config, generator),
        batch=batch,
    )
    logger.info(
        "serving %s as '%s' (context %d per sequence, %d parallel)",
        config.model.name,
        name,
        generator.n_ctx_seq,
        generator.n_slots,
    )
    defaults = replace(
        model_defaults(config.sampling_flags(), generator.generation_config), seed=config.seed
    )
    logger.info("[%s] sampling defaults: %s", name, defaults)
    source = template.source
    tool_parser = config.tool_call_parser
    how = "configured"
    if tool_parser == "auto":
        tool_parser, how = detect_parser(source or None), "auto, from the chat template"
    logger.info("[%s] tool-call parser: %s (%s)", name, tool_parser, how)
    if config.reasoning_parser == "auto":
        # deepseek_r1 or qwen3 for <think> tags: decided per prompt, by who opens the tag.
        reasoning = reasoning_parser_name("auto", "", source) or "none"
        logger.info("[%s] reasoning parser: %s (auto, from the chat template)", name, reasoning)
    return TextEngine(
        generator, scheduler, defaults, template, tool_parser, slot_files, prompt_cache
    )


def _load_adapters(config: ModelConfig, generator: TextGenerator) -> None:
    """The LoRA adapters configured for the model, loaded over it (ValueError names one that
    does not fit)."""
    if not config.lora_adapters:
        return
    if not isinstance(generator, SwitchesAdapters):
        raise ValueError(f"{config.model}: this engine runs no LoRA adapters")
    for adapter in config.lora_adapters:
        generator.lora.load(adapter.name, adapter.path)
        logger.info("[%s] LoRA adapter '%s': %s", config.served_name, adapter.name, adapter.path)


def _speculative(config: ModelConfig, generator: TextGenerator) -> SpeculativeConfig | None:
    """Drafting as --spec-type or --model-draft ask for it, sized by what verifying a draft
    costs this generator at each length (measured here); None where the engine does not verify
    drafts (MLX)."""
    if config.spec_type == "none" and config.model_draft is None:
        return None
    if not isinstance(generator, VerifiesDrafts) or not generator.verifies_drafts:
        return None
    size_m = config.draft_max
    if config.draft_cost is None:
        costs = generator.draft_costs(timed_lengths(size_m))
        cost_text = ", ".join(f"{d}: {cost:.2f}" for d, cost in costs)
        cost_text = (
            f"verifying d drafted tokens costs (d: one-token decodes) {cost_text} (measured)"
        )
    else:
        costs = linear_costs(config.draft_cost, size_m)
        cost_text = (
            f"a drafted token costs {config.draft_cost:.2f} of a one-token decode (--draft-cost)"
        )
    how = (
        f"draft model {config.model_draft.name}"
        if config.model_draft is not None
        else f"{config.spec_type}, {config.spec_ngram_size_n}-token n-grams"
    )
    logger.info(
        "[%s] speculative decoding: %s, drafts of %d to %d tokens; %s",
        config.served_name,
        how,
        max(1, config.draft_min),
        size_m,
        cost_text,
    )
    return SpeculativeConfig(config.spec_ngram_size_n, size_m, costs, config.draft_min)


def _chat_template(config: ModelConfig, generator: TextGenerator) -> ChatTemplate:
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
