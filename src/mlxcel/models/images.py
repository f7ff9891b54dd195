"""An image model: its pipeline in the model's worker process, behind a queue (in the HTTP
process) that runs one batch at a time.

The queue keeps admission (queue size and timeout, `n` images admitted whole), cancellation and
the drain where the requests are; each batch crosses to the worker as a stream of its progress
and previews, then its images (`models/proxies.py`'s `RemoteImageGenerator`), and a client that
goes away or a stopping server cancels it there between two denoising steps.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from mlxcel.config.settings import ModelConfig
from mlxcel.engine.image_queue import ImageQueue
from mlxcel.engine.image_types import ImageGenerator, ImageModelInfo
from mlxcel.engine.scheduler import SchedulerLimits
from mlxcel.models.proxies import RemoteImageGenerator
from mlxcel.models.remote import Worker, WorkerGone
from mlxcel.models.textgen import unavailable

logger = logging.getLogger(__name__)


@dataclass
class ImageModel:
    """A loaded image model: what it can do, its worker, and the queue its batches go
    through."""

    config: ModelConfig
    worker: Worker
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
        """Stop the queue's thread and end the worker: every byte of the model goes. If the
        worker died, the requests still waiting fail with how it ended."""
        gone = self.worker.gone
        self.queue.stop(None if gone is None else unavailable(WorkerGone(gone)))
        self.generator.close()


def served_image_model(config: ModelConfig, worker: Worker, info: ImageModelInfo) -> ImageModel:
    """The image model of a worker that has loaded its pipeline, its queue started."""
    generator = RemoteImageGenerator(worker, info)
    limits = SchedulerLimits(config.queue_size, config.queue_timeout)
    queue = ImageQueue(generator, limits=limits, name=config.served_name)
    queue.start()
    return ImageModel(config, worker, generator, queue)
