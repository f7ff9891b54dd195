"""Opening a speech model's engine in its worker process: Whisper on faster-whisper or
mlx-whisper, a voice on hibari, Kokoro ONNX or mlx-audio."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from mlxcel.backends.audio.defaults import HIBARI, packaged_transcription
from mlxcel.backends.audio.speech import Synthesizer
from mlxcel.backends.audio.transcript import Transcriber
from mlxcel.config.engines import speech_engine
from mlxcel.extras import install_extra


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
            raise ValueError(f"{source} is an MLX Whisper model: {install_extra('mlx-whisper')}")
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
        raise ValueError(f"{source} is an MLX Kokoro model: {install_extra('mlx-audio')}")
    return MlxKokoroSynthesizer(source)
