"""Which engine serves a model: by its kind, its format and the platform, with `--backend` to
override; read by the command line, the registry (/v1/models, /props) and the worker alike."""

from __future__ import annotations

from pathlib import Path

from mlxcel.backends.audio.defaults import (
    DEFAULT_SPEECH,
    DEFAULT_TRANSCRIPTION,
    HIBARI,
    TRANSCRIPTION_NAMES,
    packaged_transcription,
)
from mlxcel.backends.embeddings import folder_engine
from mlxcel.config.settings import ModelConfig

ENCODER_KINDS = frozenset({"embedding", "rerank"})
AUDIO_KINDS = frozenset({"transcription", "speech"})
IMAGE_BACKEND = "diffusers"


def choose_backend(model: Path, requested: str) -> str:
    """llama.cpp for a .gguf file, MLX for a model directory (transformers too, for a vision
    folder, when asked for); `requested` may only agree."""
    natural = "mlx" if model.is_dir() else "llamacpp"
    if requested == "transformers" and natural == "mlx":
        return requested
    if requested not in ("auto", natural):
        kind = "a model directory" if natural == "mlx" else "a GGUF file"
        raise ValueError(
            f"--backend {requested} cannot serve {model}, which is {kind}: "
            f"use --backend {natural} (or auto)"
        )
    return natural


def backend_label(config: ModelConfig) -> str:
    """The engine that serves (or will serve) a model, as /v1/models and /props name it."""
    if config.kind == "image":
        return IMAGE_BACKEND
    if config.kind in AUDIO_KINDS:
        return engine_label(config)
    if config.kind in ENCODER_KINDS:
        return (
            "llama.cpp"
            if config.model.is_file()
            else folder_engine(config.embedding_engine, config.model, config.kind == "rerank")
        )
    backend = choose_backend(config.model, config.backend)
    return "llama.cpp" if backend == "llamacpp" else backend


# OpenAI's model names, so that clients written for it find the default models unchanged.
OPENAI_NAMES = {
    "transcription": ("whisper-1",),
    "speech": ("tts-1", "tts-1-hd", "gpt-4o-mini-tts"),
}


def default_parallel(threads: int) -> int:
    """Requests a model runs side by side when not told: one per thread, up to four (each
    worker gets an equal share of the threads), so that no request waits behind another.
    Measured by bench/audio.py on this 2-core machine when quiet (load 1.0): 4 requests on two
    one-thread workers took 4.27 s against 8.49 s on one worker taking turns (1.99x), batching
    them across requests 8.49 s (1.00x); so --transcription-model and --speech-model get a
    thread per usable core."""
    return max(1, min(4, threads))


def side_model(kind: str, source: str, threads: int) -> ModelConfig:
    """The config of a --transcription-model or --speech-model: a packaged model is served
    under its own name with OpenAI's names as aliases; a folder under its folder's name."""
    packaged = {"transcription": DEFAULT_TRANSCRIPTION, "speech": DEFAULT_SPEECH}[kind]
    alias = packaged if source == "default" else None
    aliases = OPENAI_NAMES[kind] if source in ("default", packaged) else ()
    return ModelConfig(
        model=Path(source),
        kind=kind,  # type: ignore[arg-type]
        alias=alias,
        aliases=aliases,
        threads=threads,
        parallel=default_parallel(threads),
    )


def unknown_audio_source(kind: str, source: str) -> str | None:
    """Why a side model's source is not one this server reads (a speech model's, read to the
    engine it would run on: a graph without its voices file is refused here), or None."""
    names = {"transcription": TRANSCRIPTION_NAMES, "speech": (HIBARI,)}[kind]
    if source in ("default", *names):
        return None
    if kind == "speech":
        try:
            speech_engine(Path(source))
        except ValueError as exc:
            return str(exc)
        return None
    if Path(source).is_dir():
        return None
    return f"not a folder, nor one of the packaged models: default, {', '.join(names)}"


def speech_engine(source: Path) -> str:
    """The engine of a speech model: hibari for the packaged names, kokoro-onnx for a Kokoro
    ONNX graph with its voices file, mlx-audio for an MLX Kokoro folder; else ValueError."""
    from mlxcel.backends.audio.kokoro_onnx import kokoro_onnx_files
    from mlxcel.backends.audio.mlx_kokoro import mlx_kokoro_voices

    if str(source) in ("default", HIBARI):
        return HIBARI
    if kokoro_onnx_files(source) is not None:
        return "kokoro-onnx"
    if mlx_kokoro_voices(source) is not None:
        return "mlx-audio"
    raise ValueError(
        f"{source} is not a speech model this server reads: default, hibari, a Kokoro ONNX "
        "model (a .onnx graph beside its voices-v1.0.bin) or an MLX Kokoro folder "
        "(config.json, safetensors weights, voices/)"
    )


def engine_label(config: ModelConfig) -> str:
    """The engine that serves an audio model, as /v1/models names it."""
    if config.kind != "transcription":
        return speech_engine(config.model)
    from mlxcel.backends.audio.mlx_whisper import is_mlx_whisper

    mlx = is_mlx_whisper(packaged_transcription(str(config.model)) or config.model)
    return "mlx-whisper" if mlx else "faster-whisper"
