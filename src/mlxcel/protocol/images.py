"""Bodies of POST /v1/images/generations (JSON) and /v1/images/edits (multipart fields)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AliasChoices, Field

from mlxcel.protocol.policy import NoEffect, Refused, Strict

# OpenAI's quality names; each scales the model's default number of steps (serving/images.py).
Quality = Literal["low", "medium", "high", "auto", "standard", "hd", "xhigh", "max"]
OutputFormat = Literal["png", "jpeg", "webp"]
MAX_N = 8
MAX_PARTIAL_IMAGES = 3
MAX_STEPS = 500
MAX_PROMPT_CHARS = 32000


class ImageRequest(Strict):
    """What a text-to-image request asks for; the same options apply to an edit."""

    prompt: str = Field(min_length=1, max_length=MAX_PROMPT_CHARS)
    model: str | None = None
    n: int = Field(1, ge=1, le=MAX_N)
    size: str | None = None
    """`WIDTHxHEIGHT` or `auto`; checked against what the model takes once it is known."""
    response_format: Literal["b64_json", "url"] | None = None
    output_format: OutputFormat | None = None
    output_compression: int | None = Field(None, ge=0, le=100)
    background: Literal["transparent", "opaque", "auto"] | None = None
    quality: Quality | None = None
    stream: bool = False
    partial_images: int | None = Field(None, ge=0, le=MAX_PARTIAL_IMAGES)
    user: Annotated[str | None, NoEffect("no accounts or abuse monitoring here")] = None
    safety_identifier: Annotated[str | None, NoEffect("no abuse monitoring here")] = None
    moderation: Annotated[
        Literal["low", "auto"] | None, NoEffect("no content moderation runs here")
    ] = None
    style: Annotated[
        str | None, Refused("'style' is DALL-E 3's; a diffusion model here has no such setting")
    ] = None
    complexity: Annotated[str | None, Refused("'complexity' is for SVG output, not here")] = None
    frame_count: Annotated[int | None, Refused("animated output is not served here")] = None
    frame_duration_ms: Annotated[int | None, Refused("animated output is not served here")] = None
    svg: Annotated[Any, Refused("SVG output is not served here")] = None
    # Extensions: the knobs of a diffusion model.
    seed: int | None = Field(None, ge=0, lt=2**63)
    negative_prompt: str | None = Field(None, max_length=MAX_PROMPT_CHARS)
    num_inference_steps: int | None = Field(
        None,
        ge=1,
        le=MAX_STEPS,
        validation_alias=AliasChoices("num_inference_steps", "steps"),
    )
    guidance_scale: float | None = Field(None, ge=0, le=100)


class ImageEditRequest(ImageRequest):
    """The multipart fields of an edit besides its files (`image`, `image[]`, `mask`)."""

    input_fidelity: Annotated[
        str | None, Refused("'input_fidelity' is GPT Image's; diffusion edits use 'strength'")
    ] = None
    strength: float | None = Field(None, gt=0, le=1)
    """Image to image: how far the result may go from the input (extension)."""
