"""A loaded speech model: its engine (in the model's worker process, behind its capability
class, Transcriber or Synthesizer, which takes and gives plain data only), how many requests it
runs at once, and the limits it enforces."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

from mlxcel.backends.audio.defaults import (
    DEFAULT_SPEECH,
    DEFAULT_TRANSCRIPTION,
    HIBARI,
    TRANSCRIPTION_NAMES,
    packaged_transcription,
)
from mlxcel.backends.audio.speech import Synthesizer
from mlxcel.backends.audio.transcript import Transcriber
from mlxcel.config import ModelConfig
from mlxcel.models.proxies import RemoteSynthesizer, RemoteTranscriber
from mlxcel.models.remote import Worker

AUDIO_KINDS = frozenset({"transcription", "speech"})
# OpenAI's model names, so that clients written for it find the default models unchanged.
OPENAI_NAMES = {
    "transcription": ("whisper-1",),
    "speech": ("tts-1", "tts-1-hd", "gpt-4o-mini-tts"),
}


@dataclass
class AudioModel:
    """What audio models share: a name, a bound on requests running side by side, and the
    worker process its engine runs in."""

    name: str
    parallel: int
    worker: Worker = field(kw_only=True)
    _slots: asyncio.Semaphore | None = field(default=None, init=False, repr=False)

    @contextlib.asynccontextmanager
    async def place(self) -> AsyncIterator[None]:
        """One of the model's `parallel` places, held until the block ends."""
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.parallel)
        async with self._slots:
            yield


@dataclass
class TranscriptionModel(AudioModel):
    """A speech-to-text model."""

    engine: RemoteTranscriber = field(kw_only=True)

    def close(self) -> None:
        """End the worker: every byte of the model goes."""
        self.engine.close()


@dataclass
class SpeechModel(AudioModel):
    """A text-to-speech model."""

    engine: RemoteSynthesizer = field(kw_only=True)

    def close(self) -> None:
        """End the worker: every byte of the model goes."""
        self.engine.close()


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


def open_transcriber(source: Path, threads: int, parallel: int) -> Transcriber:
    """The engine for a transcription model: a packaged name or a CTranslate2 Whisper folder
    (faster-whisper), or an MLX Whisper folder (mlx-whisper)."""
    from mlxcel.backends.audio.faster_whisper import (
        FasterWhisperTranscriber,
        WhisperOptions,
        is_ctranslate2_whisper,
    )
    from mlxcel.backends.audio.mlx_whisper import MlxWhisperTranscriber, is_mlx_whisper

    path = packaged_transcription(str(source)) or source
    if is_mlx_whisper(path):
        if importlib.util.find_spec("mlx_whisper") is None:
            raise ValueError(
                f"{source} is an MLX Whisper model: pip install 'mlxcel[mlx-whisper]' to serve it"
            )
        return MlxWhisperTranscriber(path)
    if not is_ctranslate2_whisper(path):
        raise ValueError(
            f"{source} is not a Whisper model this server reads: a CTranslate2 Whisper folder "
            "(model.bin, config.json), an MLX Whisper folder (weights.safetensors, config.json "
            "with n_mels), or default, whisper-tiny.en or whisper-base"
        )
    return FasterWhisperTranscriber(path, WhisperOptions(threads=threads, parallel=parallel))


def open_synthesizer(source: Path, threads: int, parallel: int) -> Synthesizer:
    """The engine for a speech model (speech_engine says which); a Kokoro ONNX session runs
    each of its `parallel` requests on an equal share of the threads."""
    from mlxcel.backends.audio.hibari_voice import HibariSynthesizer
    from mlxcel.backends.audio.kokoro_onnx import KokoroOnnxSynthesizer, kokoro_onnx_files
    from mlxcel.backends.audio.mlx_kokoro import MlxKokoroSynthesizer

    engine = speech_engine(source)
    if engine == HIBARI:
        return HibariSynthesizer()
    files = kokoro_onnx_files(source)
    if files is not None:
        return KokoroOnnxSynthesizer(files, threads=max(1, threads // parallel))
    if importlib.util.find_spec("mlx_audio") is None:
        raise ValueError(f"{source} is an MLX Kokoro model: pip install 'mlxcel[mlx-audio]'")
    return MlxKokoroSynthesizer(source)
