"""diffusers pipelines on torch (CPU, or CUDA where present): text to image, image to image
and inpainting from one loaded pipeline, the three sharing its components.

A pipeline comes as a diffusers folder (model_index.json), or as a single-file checkpoint
(`.safetensors`/`.ckpt`, the original CompVis/Stability tensor names) inside such a folder:
diffusers' `from_single_file` takes the weights from the file and the configs and tokenizer
from the folder, which need hold no weights. A lone single-file checkpoint is refused: diffusers
would fetch its base model's configs from the Hugging Face hub.
"""

from __future__ import annotations

import inspect
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from mlxcel.engine.image_types import (
    GenerationCancelled,
    ImageEvent,
    ImageJob,
    ImageModelInfo,
    ImageProgress,
    ImageResult,
    PartialImage,
    Pixels,
    partial_steps,
)

logger = logging.getLogger(__name__)

# The largest side a request may ask for, whatever the model: past it a CPU takes hours.
MAX_SIDE = 2048
# The guidance a pipeline without a guidance_scale default gets (Stable Diffusion's).
FALLBACK_GUIDANCE = 7.5
FALLBACK_STEPS = 50
SINGLE_FILE_SUFFIXES = (".safetensors", ".ckpt")


def pipeline_layout_error(path: Path) -> str | None:
    """Why `path` is no pipeline this engine loads, or None when it is one."""
    if path.is_dir():
        if (path / "model_index.json").is_file():
            return None
        return f"{path} is not a diffusers pipeline folder (it has no model_index.json)"
    if path.suffix.lower() == ".gguf":
        return (
            f"{path} is a GGUF: GGUF image models are stable-diffusion.cpp's, which mlxcel does "
            "not run (slower than diffusers on a CPU: see docs/images.md, Image generation)"
        )
    if path.suffix.lower() not in SINGLE_FILE_SUFFIXES:
        return (
            f"{path} is neither a diffusers pipeline folder nor a single-file checkpoint "
            f"({', '.join(SINGLE_FILE_SUFFIXES)})"
        )
    if not (path.parent / "model_index.json").is_file():
        return (
            f"{path} is a single-file checkpoint outside a diffusers pipeline folder: put it in "
            "a folder holding its base model's model_index.json, component configs and "
            "tokenizer (the weights may be left out)"
        )
    return None


def _load_text_pipeline(path: Path, dtype: Any) -> Any:
    """The text-to-image pipeline of a folder, or of a single file configured by its folder."""
    import diffusers

    if path.is_dir():
        return diffusers.AutoPipelineForText2Image.from_pretrained(str(path), dtype=dtype)
    name = json.loads((path.parent / "model_index.json").read_text())["_class_name"]
    pipeline_class = getattr(diffusers, name, None)
    if pipeline_class is None or not hasattr(pipeline_class, "from_single_file"):
        raise ValueError(f"diffusers loads no {name} from a single file ({path})")
    return pipeline_class.from_single_file(
        str(path), config=str(path.parent), dtype=dtype, local_files_only=True
    )


def _to_pixels(images: Any) -> list[Pixels]:
    """diffusers' float images in [0, 1] as uint8 arrays, rounded as its own numpy_to_pil does."""
    array = np.asarray(images)
    return list((array * 255).round().clip(0, 255).astype(np.uint8))


def _call_default(pipeline: Any, name: str, fallback: float) -> float:
    parameter = inspect.signature(pipeline.__call__).parameters.get(name)
    if parameter is None or not isinstance(parameter.default, (int, float)):
        return fallback
    return float(parameter.default)


def _accepts(pipeline: Any, name: str) -> bool:
    return name in inspect.signature(pipeline.__call__).parameters


class DiffusersImageGenerator:
    """A diffusers pipeline (a folder, or a single file in one) loaded once, on one thread at
    a time."""

    def __init__(self, path: Path, threads: int) -> None:
        import torch
        from diffusers import AutoPipelineForImage2Image, AutoPipelineForInpainting

        # Process-wide, and the only torch user in the process; one per core this model may
        # use, since more threads than cores spin against each other.
        torch.set_num_threads(threads)
        cuda = torch.cuda.is_available()
        self._torch = torch
        self._device = "cuda" if cuda else "cpu"
        dtype = torch.float16 if cuda else torch.float32
        text = _load_text_pipeline(path, dtype)
        self._text = text.to(self._device)
        self._edit = self._derived(AutoPipelineForImage2Image)
        self._inpaint = self._derived(AutoPipelineForInpainting)
        for pipeline in (self._text, self._edit, self._inpaint):
            if pipeline is not None:
                pipeline.set_progress_bar_config(disable=True)
        self._info = self._describe()
        logger.info(
            "diffusers %s on %s: %dx%d by default, %d steps, edits %s, inpainting %s",
            type(text).__name__,
            self._device,
            *self._info.default_size,
            self._info.default_steps,
            "yes" if self._edit is not None else "no",
            "yes" if self._inpaint is not None else "no",
        )

    def _derived(self, auto: Any) -> Any:
        """The pipeline of another task over the same components, or None if there is none."""
        try:
            return auto.from_pipe(self._text)
        except (ValueError, TypeError, KeyError) as exc:
            logger.info("%s: %s", auto.__name__, exc)
            return None

    def _describe(self) -> ImageModelInfo:
        text = self._text
        scale = int(getattr(text, "vae_scale_factor", 8))
        # Transformer pipelines (FLUX, SD3) pack 2x2 latent patches.
        packed = getattr(text, "transformer", None) is not None
        multiple = max(8, scale * (2 if packed else 1))
        denoiser = getattr(text, "unet", None) or getattr(text, "transformer", None)
        sample = getattr(text, "default_sample_size", None)
        if sample is None and denoiser is not None:
            sample = getattr(denoiser.config, "sample_size", None)
        side = int(sample) * scale if isinstance(sample, int) else 512
        return ImageModelInfo(
            engine="diffusers",
            default_size=(side, side),
            multiple=multiple,
            max_side=MAX_SIDE,
            default_steps=int(_call_default(text, "num_inference_steps", FALLBACK_STEPS)),
            default_guidance=_call_default(text, "guidance_scale", FALLBACK_GUIDANCE),
            negative_prompt=_accepts(text, "negative_prompt"),
            guidance=_accepts(text, "guidance_scale"),
            image_to_image=self._edit is not None,
            inpainting=self._inpaint is not None,
            max_input_images=1 if self._edit is not None or self._inpaint is not None else 0,
        )

    @property
    def info(self) -> ImageModelInfo:
        """What the model can do."""
        return self._info

    def generate(
        self, job: ImageJob, emit: Callable[[ImageEvent], None], cancelled: Callable[[], bool]
    ) -> ImageResult:
        """Run one batch of `job.n` images; GenerationCancelled between steps once asked."""
        pipeline, kwargs = self._pipeline_for(job)
        previews: list[int] = []
        shown = 0

        def on_step(pipe: Any, index: int, _: Any, tensors: dict[str, Any]) -> dict[str, Any]:
            nonlocal previews, shown
            total = int(pipe.num_timesteps)
            if index == 0:
                previews = partial_steps(total, job.partial_images)
            emit(ImageProgress(index + 1, total))
            if index + 1 in previews:
                for i, pixels in enumerate(self._preview(pipe, tensors["latents"], job)):
                    emit(PartialImage(i, shown, pixels))
                shown += 1
            if cancelled():
                raise GenerationCancelled
            return tensors

        generators = [
            self._torch.Generator(device="cpu").manual_seed(job.seed + i) for i in range(job.n)
        ]
        with self._torch.inference_mode():
            output = pipeline(
                prompt=job.prompt,
                height=job.height,
                width=job.width,
                num_images_per_prompt=job.n,
                num_inference_steps=job.steps,
                generator=generators,
                output_type="np",
                callback_on_step_end=on_step,
                callback_on_step_end_tensor_inputs=["latents"],
                **kwargs,
            )
        images = _to_pixels(output.images)
        if job.mask is not None and job.image is not None:
            keep = job.mask[..., None] == 0
            images = [np.where(keep, job.image, image) for image in images]
        return ImageResult(images, self._prompt_tokens(job.prompt), int(pipeline.num_timesteps))

    def _pipeline_for(self, job: ImageJob) -> tuple[Any, dict[str, Any]]:
        from PIL import Image

        kwargs: dict[str, Any] = {}
        if job.guidance_scale is not None:
            kwargs["guidance_scale"] = job.guidance_scale
        if job.negative_prompt is not None:
            kwargs["negative_prompt"] = job.negative_prompt
        if job.image is None:
            return self._text, kwargs
        kwargs["image"] = Image.fromarray(job.image)
        if job.strength is not None:
            kwargs["strength"] = job.strength
        if job.mask is not None:
            kwargs["mask_image"] = Image.fromarray(job.mask)
            return self._inpaint, kwargs
        return self._edit, kwargs

    def _preview(self, pipe: Any, latents: Any, job: ImageJob) -> list[Pixels]:
        """The latents so far, decoded by the VAE as the final image will be."""
        vae = pipe.vae
        if latents.ndim == 3 and hasattr(pipe, "_unpack_latents"):
            latents = pipe._unpack_latents(latents, job.height, job.width, pipe.vae_scale_factor)
        latents = latents / vae.config.scaling_factor
        shift = getattr(vae.config, "shift_factor", None)
        if shift is not None:
            latents = latents + shift
        decoded = vae.decode(latents.to(vae.dtype), return_dict=False)[0]
        return _to_pixels(pipe.image_processor.postprocess(decoded, output_type="np"))

    def _prompt_tokens(self, prompt: str) -> int:
        tokenizer = getattr(self._text, "tokenizer", None)
        if tokenizer is None:
            return 0
        return len(tokenizer(prompt, truncation=True).input_ids)

    def close(self) -> None:
        """Drop the pipelines (their shared components go with the last of them)."""
        self._text = self._edit = self._inpaint = None
        if self._device == "cuda":
            self._torch.cuda.empty_cache()
