"""Models from the command line's side-model flags and from a --config file, each checked
(weights found, kind servable, names unique) before anything loads."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path
from typing import NoReturn

from mlxcel.config import Kind, ModelConfig
from mlxcel.config_file import FileConfig, ModelSection, unservable
from mlxcel.weights import WeightsError, hub_id, resolve_model

# Side-model flags: each adds a model of its kind beside -m's.
SIDE_MODELS: dict[str, Kind] = {
    "embedding_model": "embedding",
    "reranker_model": "rerank",
    "transcription_model": "transcription",
    "speech_model": "speech",
    "image_model": "image",
}


def fail(parser: argparse.ArgumentParser, message: str) -> NoReturn:
    parser.exit(2, f"{parser.prog}: error: {message}\n")


def side_models(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[ModelConfig]:
    """A ModelConfig per side-model flag; one whose kind nothing here serves stops the start."""
    models = []
    for dest, kind in SIDE_MODELS.items():
        source = getattr(args, dest)
        if source is None:
            continue
        why = unservable(kind)
        if why is not None:
            fail(parser, f"--{dest.replace('_', '-')} {source}: {why}")
        models.append(ModelConfig(model=Path(source), kind=kind, hub_id=hub_id(source)))
    return models


def _file_model(
    parser: argparse.ArgumentParser,
    file: FileConfig,
    index: int,
    section: ModelSection,
    base: ModelConfig,
) -> ModelConfig:
    """One entry of the file as a ModelConfig, its weights found and its kind servable."""
    from mlxcel.models.loader import choose_backend

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
    try:
        model = resolve_model(source)
        config = replace(base, model=model, hub_id=hub_id(source), **values)
        choose_backend(config.model, config.backend)
    except (WeightsError, ValueError, OSError) as exc:
        fail(parser, f"{at}: {what}: {exc}")
    template = config.chat_template_file
    if template is not None and not template.is_file():
        line = file.where(section.lines["chat_template_file"])
        fail(parser, f"{line}: {what}.chat_template_file {template}: no such file")
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
