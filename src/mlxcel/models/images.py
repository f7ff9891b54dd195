"""An image model as the server holds it: its pipeline behind a queue of one batch at a time.

The capability routes use is `ImageQueue.submit(request_id, ImageJob)`, whose inputs and
outputs are plain dataclasses and numpy arrays, so the model can move into a worker process.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from mlxcel.config import ModelConfig
from mlxcel.engine.image_queue import ImageQueue
from mlxcel.engine.image_types import ImageGenerator, ImageModelInfo
from mlxcel.engine.scheduler import SchedulerLimits
from mlxcel.progress import progress

logger = logging.getLogger(__name__)

IMAGE_BACKEND = "diffusers"


@dataclass
class ImageModel:
    """A loaded image model: what it can do, and the queue its batches go through."""

    config: ModelConfig
    generator: ImageGenerator
    queue: ImageQueue

    @property
    def name(self) -> str:
        """The served name."""
        return self.config.served_name

    @property
    def info(self) -> ImageModelInfo:
        """Sizes, defaults and the edits the model does."""
        return self.generator.info

    def close(self) -> None:
        """Stop the queue's thread and free the pipeline."""
        self.queue.stop()
        self.generator.close()


def _check_layout(config: ModelConfig) -> None:
    if not (config.model / "model_index.json").is_file():
        raise ValueError(
            f"{config.model} is not a diffusers pipeline folder (it has no model_index.json)"
        )


def load_image_model(config: ModelConfig) -> ImageModel:
    """Load a diffusers pipeline folder and start the queue that owns it."""
    _check_layout(config)
    from mlxcel.backends.images.diffusers_engine import DiffusersImageGenerator

    logger.info("loading %s with diffusers (%d threads)", config.model, config.threads)
    with progress(f"loading {config.model.name}"):
        generator = DiffusersImageGenerator(config.model, config.threads)
    limits = SchedulerLimits(config.queue_size, config.queue_timeout)
    queue = ImageQueue(generator, limits=limits, name=config.served_name)
    queue.start()
    width, height = generator.info.default_size
    logger.info("serving %s as '%s' (%dx%d)", config.model.name, config.served_name, width, height)
    return ImageModel(config, generator, queue)
