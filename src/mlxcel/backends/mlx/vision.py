"""An MLX vision-language model on mlx-vlm: its processor lays out a prompt's images (and, on
a model that hears, its audio clips), its towers embed them, and the language model runs them
as embedding rows in the slots."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import KVCache, make_prompt_cache
from mlx_vlm.utils import load_model as load_vlm
from mlx_vlm.utils import load_processor

from mlxcel.backends.mlx.generator import MlxGenerator, MlxOptions, Slot
from mlxcel.backends.mlx.hearing import Hearing, check_lengths, clip_rows, hearing
from mlxcel.backends.mlx.mrope import chunk_positions, decode_positions, grid_positions
from mlxcel.engine.media import ImageRows, rows_key
from mlxcel.engine.positions import MropePositions
from mlxcel.engine.types import EngineError, Feed, MediaSpan
from mlxcel.media.audio import Audio, Media
from mlxcel.media.images import MEDIA_MARKER, Image

# The M-RoPE models whose language model takes the prompt as input embeddings and position
# ids (Qwen3-VL also the vision features its first layers add at the image's tokens).
_MROPE_FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")


class VisionLanguageModel:
    """mlx-vlm's language model as the generator calls one: token ids (or input embeddings)
    and a KV cache in, logits out; `embed` makes a prompt chunk's input embeddings."""

    def __init__(self, model: Any) -> None:
        self._model = model
        self._language = model.language_model
        if hasattr(self._language, "make_cache"):
            # mlx-lm's make_prompt_cache asks the model for its cache kinds where it has them.
            self.make_cache = self._language.make_cache

    @property
    def layers(self) -> Any:
        return self._language.layers

    def __call__(self, inputs: mx.array, cache: Any = None, **extra: Any) -> mx.array:
        """Logits; `extra`: position ids and what `embed` made, where given."""
        logits: mx.array = self._language(inputs, cache=cache, **extra).logits
        return logits

    def prompt_embeddings(self, inputs: dict[str, Any]) -> tuple[mx.array, list[mx.array]]:
        """The whole prompt's input embeddings ([tokens, width]), images merged in, from the
        processor's output; and the deepstack features ([image tokens, width] a layer) a
        Qwen3-VL adds into its first layers at the image tokens, in prompt order."""
        # Processors answer in lists, NumPy or MLX arrays, whichever transformers left them in.
        arrays = {key: _as_mlx(value) for key, value in inputs.items()}
        features = self._model.get_input_embeddings(**arrays)
        deepstack = getattr(features, "deepstack_visual_embeds", None)
        return features.inputs_embeds[0], list(deepstack or ())

    def input_embeddings(self, **inputs: Any) -> Any:
        """mlx-vlm's get_input_embeddings: its features (input embeddings and the rest)."""
        return self._model.get_input_embeddings(**inputs)

    def embed(
        self, tokens: Sequence[int], media: Sequence[tuple[int, np.ndarray]]
    ) -> dict[str, Any]:
        """The language model's inputs for `tokens` besides their ids: input embeddings
        ([1, n, width]) with each image's rows where it sits; rows of [tokens, 1 + layers,
        width] also bring their deepstack features and the mask of where they go; a model
        with per-layer inputs (Gemma 4) gets them, a medium's positions taking token 0's as
        mlx-vlm gives them."""
        # A medium's positions hold placeholder ids (negative): embedded as token 0, replaced.
        ids = mx.array([max(token, 0) for token in tokens])[None]
        features = self._model.get_input_embeddings(ids)
        text: mx.array = features.inputs_embeds
        parts = []
        pos = 0
        for offset, rows in media:
            first = rows[:, 0] if rows.ndim == 3 else rows
            parts += [text[:, pos:offset], mx.array(first).astype(text.dtype)[None]]
            pos = offset + len(rows)
        parts.append(text[:, pos:])
        inputs: dict[str, Any] = {"inputs_embeds": mx.concatenate(parts, axis=1)}
        if getattr(features, "per_layer_inputs", None) is not None:
            inputs["per_layer_inputs"] = features.per_layer_inputs
        stacked = [rows[:, 1:] for _, rows in media if rows.ndim == 3]
        if stacked:
            mask = np.zeros((1, len(tokens)), bool)
            for offset, rows in media:
                mask[0, offset : offset + len(rows)] = rows.ndim == 3
            layers = mx.array(np.concatenate(stacked)).astype(text.dtype)
            inputs["visual_pos_masks"] = mx.array(mask)
            inputs["deepstack_visual_embeds"] = [layers[:, i] for i in range(layers.shape[1])]
        return inputs


def _as_mlx(value: Any) -> Any:
    """A processor's output as MLX arrays; a list of arrays of different shapes (Gemma 4's
    images of different sizes, which its vision tower takes one by one) as a list of them."""
    if isinstance(value, list) and len({np.shape(item) for item in value}) > 1:
        return [mx.array(np.asarray(item)) for item in value]
    if isinstance(value, list | np.ndarray):
        return mx.array(np.asarray(value))
    return value


def _media_runs(ids: np.ndarray, token: int, count: int, kind: str) -> list[np.ndarray]:
    """The prompt positions of each medium's tokens: a run of its `kind`'s token each (media
    side by side split evenly)."""
    positions = np.flatnonzero(ids == token)
    breaks = np.flatnonzero(np.diff(positions) != 1) + 1
    runs = np.split(positions, breaks) if positions.size else []
    if len(runs) != count and count and positions.size % count == 0:
        runs = np.split(positions, count)
    if len(runs) != count or any(run[-1] - run[0] + 1 != len(run) for run in runs):
        raise EngineError(
            f"the prompt's {kind} tokens do not make {count} {kind}s (a {kind} token typed "
            "in the text?)",
            "invalid_request",
        )
    return runs


class MlxVisionGenerator(MlxGenerator):
    """MlxGenerator for an mlx-vlm model: a prompt's images are evaluated from the vision
    tower's embeddings (Feed.media), its text and every decode step as on a text model. On a
    model that hears (hearing.py), an audio clip is rows of the audio tower's embeddings the
    same way, each clip embedded on its own.

    Positions run one after another through images and text alike, except on a model with
    M-RoPE positions (the Qwen2-VL and Qwen3-VL families): there each image lies on its grid
    (mrope.py) and every prompt chunk and decode step passes the model its position ids, the
    slot's jumps mapping token indices to positions; a saved slot state (the host-memory
    prompt cache) keeps its jumps. Qwen3-VL's deepstack features ride in an image's rows
    (`embed`).
    """

    scores_prompts = False  # its forward takes position ids and embeddings beside token ids

    def __init__(self, path: Path, options: MlxOptions) -> None:
        # Embedding rows of recent images and clips, by digest and token count.
        self._media_rows = ImageRows()
        super().__init__(path, options)

    def _load(self, path: Path, options: MlxOptions) -> None:
        super()._load(path, options)
        if not self._merge:
            return
        if not all(type(layer) is KVCache for layer in self._call(make_prompt_cache, self._model)):
            # A cache that cannot drop tokens is evaluated again for prefix reuse, which
            # knows no image's grid.
            raise ValueError(f"{path}: M-RoPE positions need plain KV caches on every layer")

    def _open_model(self, path: Path) -> tuple[Any, dict[str, Any]]:
        config: dict[str, Any] = json.loads((path / "config.json").read_text())
        text = {**config, **config.get("text_config", {})}
        rope = {**(text.get("rope_scaling") or {}), **(text.get("rope_parameters") or {})}
        # The spatial merge of an M-RoPE model's grid; 0: positions one after another.
        self._merge = 0
        if "mrope_section" in rope and config.get("model_type") not in _MROPE_FAMILIES:
            raise ValueError(
                f"{path}: mlxcel lays out M-RoPE positions for {', '.join(_MROPE_FAMILIES)} "
                f"models on MLX, not {config.get('model_type')} (serve its GGUF instead)"
            )
        if "mrope_section" in rope:
            self._merge = int(config.get("vision_config", {}).get("spatial_merge_size", 2))
        # Loading the model first imports its mlx-vlm module, which registers its processor.
        model = VisionLanguageModel(load_vlm(path))
        self._processor = load_processor(path, add_detokenizer=False)
        image_token = getattr(self._processor, "image_token", None)
        token_id = config.get("image_token_index", config.get("image_token_id"))
        if not isinstance(image_token, str) or not isinstance(token_id, int):
            raise ValueError(f"{path}: mlx-vlm's processor names no image token for this model")
        self._image_token_id = token_id
        # Qwen2-VL's chat template puts an image between its vision start and end tokens.
        bounds = [config.get(f"vision_{end}_token_id") for end in ("start", "end")]
        if self._merge and all(isinstance(bound, int) for bound in bounds):
            start, end = self._processor.tokenizer.convert_ids_to_tokens(bounds)
            self._image_text = f"{start}{image_token}{end}"
        else:
            self._image_text = image_token
        self._hearing = hearing(config, self._processor)
        return model, config

    @property
    def input_modalities(self) -> tuple[str, ...]:
        return ("text", "image", "audio") if self._hearing else ("text", "image")

    @property
    def media_marker(self) -> str:
        return MEDIA_MARKER

    @property
    def audio_rate(self) -> int | None:
        return self._hearing.rate if self._hearing else None

    def tokenize_with_media(
        self, text: str, media: Sequence[Media]
    ) -> tuple[list[int], tuple[MediaSpan, ...]]:
        images = [medium for medium in media if isinstance(medium, Image)]
        clips = [medium for medium in media if isinstance(medium, Audio)]
        if clips and self._hearing is None:
            raise EngineError("model does not support audio input", "invalid_request")
        if self._hearing is not None:
            check_lengths(self._hearing, clips)
        if text.count(MEDIA_MARKER) != len(media):
            raise EngineError(
                f"the prompt has {text.count(MEDIA_MARKER)} media markers for {len(media)} "
                "images and clips",
                "invalid_request",
            )
        inputs = self._processor(text=self._laid_out(text, media), **self._media_inputs(media))
        ids = np.array(inputs["input_ids"]).reshape(-1)
        runs = _media_runs(ids, self._image_token_id, len(images), "image")
        clip_runs: list[np.ndarray] = []
        clip_rows: list[np.ndarray] = []
        if self._hearing is not None:
            clip_runs = _media_runs(ids, self._hearing.token_id, len(clips), "audio")
            clip_rows = self._call(self._embed_clips, self._hearing, clips, clip_runs)
        if any(run[-1] == len(ids) - 1 for run in runs + clip_runs):
            raise EngineError("a prompt cannot end with an image or a clip", "invalid_request")
        grids = self._grids(inputs, runs)
        keys = [rows_key(image.digest, len(run)) for image, run in zip(images, runs, strict=True)]
        embeddings = self._call(self._embed_images, self._image_inputs(inputs), runs, keys)
        tokens = ids.tolist()
        spans = [
            MediaSpan(int(run[0]), rows, image.digest, grid)
            for run, rows, image, grid in zip(runs, embeddings, images, grids, strict=True)
        ]
        spans += [
            MediaSpan(int(run[0]), rows, clip.digest)
            for run, rows, clip in zip(clip_runs, clip_rows, clips, strict=True)
        ]
        spans.sort(key=lambda span: span.start)
        for span in spans:
            tokens[span.start : span.end] = [span.placeholder] * len(span.embeddings)
        return tokens, tuple(spans)

    def _laid_out(self, text: str, media: Sequence[Media]) -> str:
        """The prompt with each marker replaced by the processor's text for its medium."""
        pieces = text.split(MEDIA_MARKER)
        clip_text = self._hearing.token if self._hearing else ""
        out = [pieces[0]]
        for medium, piece in zip(media, pieces[1:], strict=True):
            out += [clip_text if isinstance(medium, Audio) else self._image_text, piece]
        return "".join(out)

    def _media_inputs(self, media: Sequence[Media]) -> dict[str, Any]:
        """The processor's media arguments: the images as PIL images, the clips' samples (at
        the rate its feature extractor takes, which they were decoded at); none left empty."""
        images = [medium.to_pil() for medium in media if isinstance(medium, Image)]
        clips = [np.frombuffer(m.samples, np.float32) for m in media if isinstance(m, Audio)]
        return {key: value for key, value in (("images", images), ("audio", clips)) if value}

    def _image_inputs(self, inputs: Any) -> dict[str, Any]:
        """The processor's output without its audio features: the images' tower reads the
        rest, the clips are embedded one by one (`_embed_clips`)."""
        extractor = self._hearing.extractor if self._hearing else None
        audio_keys = set(getattr(extractor, "model_input_names", ()))
        return {key: value for key, value in dict(inputs).items() if key not in audio_keys}

    def _grids(self, inputs: Any, runs: list[np.ndarray]) -> list[MropePositions] | list[None]:
        """Each image's M-RoPE positions from the processor's grid (t, h, w in patches)."""
        if not self._merge:
            return [None] * len(runs)
        grids = np.asarray(inputs["image_grid_thw"]).reshape(-1, 3).tolist()
        out = [grid_positions(t, h // self._merge, w // self._merge) for t, h, w in grids]
        if [len(grid.base[0]) for grid in out] != [len(run) for run in runs]:
            raise EngineError(
                "the prompt's image tokens do not match the images' grids", "invalid_request"
            )
        return out

    def _prompt_positions(self, state: Slot, tokens: list[int], feed: Feed) -> mx.array | None:
        if not self._merge:
            return None
        return chunk_positions(state.jumps, len(state.tokens), len(tokens), feed.media, feed.mrope)

    def _decode_positions(self, rows: list[Slot]) -> mx.array | None:
        if not self._merge:
            return None
        return decode_positions([row.jumps.position(len(row.tokens)) for row in rows])

    def _embed_images(
        self, inputs: dict[str, Any], runs: list[np.ndarray], keys: list[str]
    ) -> list[np.ndarray]:
        """Each image's rows of the prompt's input embeddings (on the MLX thread): from the
        cache when it holds every image of the prompt, else from the vision tower."""
        kept = [self._media_rows.get(key) for key in keys]
        if all(rows is not None for rows in kept):
            return [rows for rows in kept if rows is not None]
        merged, deepstack = self._model.prompt_embeddings(inputs)
        mx.eval(merged, deepstack)
        embedded, done = [], 0
        for run in runs:
            rows = merged[int(run[0]) : int(run[-1]) + 1]
            if deepstack:
                # Each token's row, then its deepstack rows: [tokens, 1 + layers, width].
                rows = mx.stack([rows] + [layer[done : done + len(run)] for layer in deepstack], 1)
            embedded.append(np.array(rows.astype(mx.float32)))
            done += len(run)
        for key, rows in zip(keys, embedded, strict=True):
            self._media_rows.put(key, rows)
        return embedded

    def _embed_clips(
        self, hears: Hearing, clips: list[Audio], runs: list[np.ndarray]
    ) -> list[np.ndarray]:
        """Each clip's rows of input embeddings (on the MLX thread), from the cache or its
        audio tower."""
        embedded = []
        for clip, run in zip(clips, runs, strict=True):
            key = rows_key(clip.digest, len(run))
            rows = self._media_rows.get(key)
            if rows is None:
                rows = clip_rows(self._model.input_embeddings, hears, clip, len(run))
                self._media_rows.put(key, rows)
            embedded.append(rows)
        return embedded
