"""Opening an image model's diffusers pipeline in its worker process."""

from __future__ import annotations

import logging

from mlxcel.config.settings import ModelConfig
from mlxcel.engine.image_types import ImageGenerator
from mlxcel.progress import progress

logger = logging.getLogger(__name__)


def open_image_generator(config: ModelConfig) -> ImageGenerator:
    """Load a diffusers pipeline, a folder or a single file in one (in the model's worker
    process)."""
    from mlxcel.backends.images.diffusers_engine import (
        DiffusersImageGenerator,
        pipeline_layout_error,
    )

    why = pipeline_layout_error(config.model)
    if why is not None:
        raise ValueError(why)

    logger.info("loading %s with diffusers (%d threads)", config.model, config.threads)
    with progress(f"loading {config.model.name}"):
        generator = DiffusersImageGenerator(config.model, config.threads)
    width, height = generator.info.default_size
    logger.info("serving %s as '%s' (%dx%d)", config.model.name, config.served_name, width, height)
    return generator
