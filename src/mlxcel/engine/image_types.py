"""What an image engine takes and gives: plain, picklable data, so a model can live in a
worker process of its own; and the protocol every image engine follows."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

# Pixels are uint8 arrays: (height, width, 3) for an image, (height, width) for a mask, where
# 255 marks what an edit may repaint and 0 what it keeps.
Pixels = np.ndarray


class GenerationCancelled(Exception):
    """The request was cancelled between two denoising steps."""


@dataclass(frozen=True)
class ImageModelInfo:
    """What a loaded image model can do, resolved once at load."""

    engine: str
    default_size: tuple[int, int]
    """(width, height) for `size: auto`."""
    multiple: int
    """Each side must be a multiple of this."""
    max_side: int
    default_steps: int
    default_guidance: float
    negative_prompt: bool
    guidance: bool
    image_to_image: bool
    inpainting: bool
    max_input_images: int
    """How many input images an edit may take (0: the model does no edits)."""


@dataclass(frozen=True)
class ImageJob:
    """One batch: `n` images of one prompt, from text or from an input image."""

    prompt: str
    width: int
    height: int
    n: int
    steps: int
    seed: int
    """Image `i` of the batch starts from the noise of seed `seed + i`."""
    guidance_scale: float | None = None
    negative_prompt: str | None = None
    partial_images: int = 0
    """How many previews of the denoising latents to send before the final images (0-3)."""
    image: Pixels | None = None
    """An edit's input image, already at (height, width)."""
    mask: Pixels | None = None
    """Inpainting: 255 where the image is repainted; the rest is kept pixel for pixel."""
    strength: float | None = None
    """Image to image: how far from the input the result may go (0-1]."""


@dataclass(frozen=True)
class ImageProgress:
    """A denoising step finished."""

    step: int
    total: int


@dataclass(frozen=True)
class PartialImage:
    """A preview of one image of the batch, decoded from the latents at an intermediate step."""

    index: int
    """Which image of the batch it previews."""
    partial_index: int
    """0-based, per image."""
    pixels: Pixels


@dataclass(frozen=True)
class ImageResult:
    """The finished batch."""

    images: list[Pixels]
    prompt_tokens: int
    steps: int


ImageEvent = ImageProgress | PartialImage


class ImageGenerator(Protocol):
    """An image engine: one pipeline that runs one batch at a time."""

    @property
    def info(self) -> ImageModelInfo:
        """What the model can do."""
        ...

    def generate(
        self, job: ImageJob, emit: Callable[[ImageEvent], None], cancelled: Callable[[], bool]
    ) -> ImageResult:
        """Run one batch; GenerationCancelled once `cancelled()` is true between steps."""
        ...

    def close(self) -> None:
        """Free the weights."""
        ...


def partial_steps(steps: int, partial_images: int) -> list[int]:
    """The steps (1-based) after which a preview is sent: evenly spread, never the last."""
    wanted = {round((k + 1) * steps / (partial_images + 1)) for k in range(partial_images)}
    return sorted(step for step in wanted if 0 < step < steps)
