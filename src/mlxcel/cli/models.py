"""Models from the command line's side-model flags and from a --config file, each checked
(weights found, kind servable, names unique) before anything loads."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import NoReturn

from mlxcel.backends.images.diffusers_engine import pipeline_layout_error
from mlxcel.config.adapters import located, scaled
from mlxcel.config.cores import usable_cores
from mlxcel.config.engines import AUDIO_KINDS, side_model, unknown_audio_source
from mlxcel.config.file import FileConfig, ModelSection, unservable
from mlxcel.config.rpc import rpc_problem
from mlxcel.config.settings import (
    DEFAULT_IMAGE_MAX_PIXELS,
    DEFAULT_IMAGE_MAX_STEPS,
    DEFAULT_IMAGE_URL_MAX_MIB,
    DEFAULT_IMAGE_URL_TTL,
    Kind,
    ModelConfig,
    speculation_problem,
)
from mlxcel.weights import WeightsError, hub_id, resolve_model

# Side-model flags: each adds a model of its kind beside -m's.
SIDE_MODELS: dict[str, Kind] = {
    "embedding_model": "embedding",
    "reranker_model": "rerank",
    "transcription_model": "transcription",
    "speech_model": "speech",
    "image_model": "image",
}


def add_image_url_flags(add: Callable[..., object]) -> None:
    """The flags that bound image answers: their size, and what `response_format: url`
    answers keep."""
    add(
        "--image-max-pixels",
        type=int,
        default=DEFAULT_IMAGE_MAX_PIXELS,
        metavar="N",
        help="pixels one generated or edited image may have, width times height; larger "
        "sizes get 400 before any work (default: %(default)s, 1536x1024)",
    )
    add(
        "--image-max-steps",
        type=int,
        default=DEFAULT_IMAGE_MAX_STEPS,
        metavar="S",
        help="with --image-max-pixels, what one image request may cost: images x steps x "
        "pixels at most --image-max-pixels x S; more gets 400 before any work "
        "(default: %(default)s)",
    )
    add(
        "--image-url-ttl",
        type=float,
        default=DEFAULT_IMAGE_URL_TTL,
        metavar="SECONDS",
        help="how long an image answered by url stays at its link (default: %(default)g)",
    )
    add(
        "--image-url-max-mib",
        type=int,
        default=DEFAULT_IMAGE_URL_MAX_MIB,
        metavar="MIB",
        help="MiB the linked images may take together, the oldest dropped first past it "
        "(default: %(default)s)",
    )


def fail(parser: argparse.ArgumentParser, message: str) -> NoReturn:
    parser.exit(2, f"{parser.prog}: error: {message}\n")


def side_models(
    parser: argparse.ArgumentParser, args: argparse.Namespace, base: ModelConfig
) -> list[ModelConfig]:
    """A ModelConfig per side-model flag (threads and batch sizes from `base`); one whose kind
    nothing here serves, or whose weights are missing, stops the start."""
    models = []
    for dest, kind in SIDE_MODELS.items():
        source = getattr(args, dest)
        if source is None:
            continue
        flag = f"--{dest.replace('_', '-')}"
        why = unservable(kind)
        if why is not None:
            fail(parser, f"{flag} {source}: {why}")
        if kind in AUDIO_KINDS:
            models.append(_audio_model(parser, kind, source))
            continue
        try:
            path, alias = side_weights(kind, source)
        except (WeightsError, OSError) as exc:
            fail(parser, f"{flag} {source}: {exc}")
        models.append(
            ModelConfig(
                model=path,
                kind=kind,
                alias=alias,
                hub_id=None if alias else hub_id(source),
                threads=base.threads,
                embedding_batch_tokens=base.embedding_batch_tokens,
                embedding_engine=base.embedding_engine,
                queue_size=base.queue_size,
                queue_timeout=base.queue_timeout,
            )
        )
    return models


def side_weights(kind: Kind, source: str) -> tuple[Path, str | None]:
    """A side model's weights, and its served name when it is a packaged default."""
    from mlxcel.weights import DEFAULT_EMBEDDING_NAME, default_embedding_model

    if source == "default":
        if kind != "embedding":
            raise WeightsError("no model of this kind is packaged: give a folder or a GGUF")
        return default_embedding_model(), DEFAULT_EMBEDDING_NAME
    if kind in ("embedding", "rerank"):
        path = Path(source).expanduser()
        if not path.exists():
            raise WeightsError("no such file or folder")
        # modules.json: a sentence-transformers folder, whose modules hold their configs (CLIP).
        if path.is_dir() and not any((path / n).is_file() for n in ("config.json", "modules.json")):
            raise WeightsError("not a model folder (no config.json)")
        if path.is_file() and path.suffix.lower() != ".gguf":
            raise WeightsError("not a GGUF file or a model folder")
        return path, None
    if kind == "image" and Path(source).expanduser().is_file():
        why = pipeline_layout_error(Path(source).expanduser())
        if why is not None:
            raise WeightsError(why)
        return Path(source).expanduser(), None
    return resolve_model(source), None


def _audio_model(parser: argparse.ArgumentParser, kind: Kind, source: str) -> ModelConfig:
    why = unknown_audio_source(kind, source)
    if why is not None:
        fail(parser, f"--{kind}-model {source}: {why}")
    # Every usable core, not llama.cpp's all-but-one: its workers take requests side by side,
    # one thread each, with no barrier between them (models/audio.py: default_parallel).
    return side_model(kind, source, usable_cores())


def _file_model(
    parser: argparse.ArgumentParser,
    file: FileConfig,
    index: int,
    section: ModelSection,
    base: ModelConfig,
) -> ModelConfig:
    """One entry of the file as a ModelConfig, its weights found and its kind servable."""
    from mlxcel.config.engines import choose_backend

    values = dict(section.values)
    source = str(values.pop("model"))
    at = file.where(section.lines["model"])
    what = f"models[{index}]"
    why = unservable(values.get("kind", "text"))
    if why is not None:
        fail(parser, f"{file.where(section.lines.get('kind', section.line))}: {what}: {why}")
    beside = file.path.parent / source
    if not Path(source).is_absolute() and beside.exists():
        source = str(beside)
    kind = values.get("kind", "text")
    try:
        if "lora_scales" in values:
            given = values.pop("lora_scales")
            values["lora_adapters"] = scaled(values.get("lora_adapters", ()), given)
        if "lora_adapters" in values:
            values["lora_adapters"] = located(values["lora_adapters"], file.path.parent)
        if kind in ("text", "vision"):
            config = replace(base, model=resolve_model(source), hub_id=hub_id(source), **values)
            choose_backend(config.model, config.backend)
        elif kind in AUDIO_KINDS:
            why = unknown_audio_source(kind, source)
            if why is not None:
                raise ValueError(why)
            config = replace(base, model=Path(source), **values)
        else:
            model, name = side_weights(kind, source)
            values.setdefault("alias", name)
            config = replace(base, model=model, hub_id=None if name else hub_id(source), **values)
    except (WeightsError, ValueError, OSError) as exc:
        fail(parser, f"{at}: {what}: {exc}")
    template = config.chat_template_file
    if template is not None and not template.is_file():
        line = file.where(section.lines["chat_template_file"])
        fail(parser, f"{line}: {what}.chat_template_file {template}: no such file")
    problem = config.kv_cache_problem() or speculation_problem(
        config.spec_ngram_size_n,
        config.draft_max,
        config.draft_min,
        config.model_draft,
        config.spec_type,
    )
    if problem is not None:
        line = file.where(section.lines.get("cache_type_v", section.line))
        fail(parser, f"{line}: {what}: {problem}")
    problem = rpc_problem(config.rpc, config.rpc_key_file)
    if problem is not None:
        line = file.where(section.lines.get("rpc", section.line))
        fail(parser, f"{line}: {what}: {problem}")
    return config


def file_models(
    parser: argparse.ArgumentParser, file: FileConfig, base: ModelConfig
) -> list[ModelConfig]:
    """The file's models, `base` (the flags) as their defaults; names and aliases unique."""
    models: list[ModelConfig] = []
    owners: dict[str, int] = {}
    for index, section in enumerate(file.models):
        config = _file_model(parser, file, index, section, base)
        for name in config.names:
            if name in owners:
                key = "alias" if name == config.served_name else "aliases"
                line = section.lines.get(key, section.line)
                fail(
                    parser,
                    f"{file.where(line)}: models[{index}]: the name '{name}' is already "
                    f"models[{owners[name]}]'s; each name and alias must be unique",
                )
            owners[name] = index
        models.append(config)
    return models
