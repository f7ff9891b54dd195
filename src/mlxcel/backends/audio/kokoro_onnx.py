"""Kokoro ONNX models as the kokoro-onnx project distributes them (kokoro-v1.0.onnx beside
voices-v1.0.bin, an .npz of voice name -> style array [510, 1, 256]), on ONNX Runtime; the
phonemes come from kokoro_text (no espeak-ng)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mlxcel.backends.audio.kokoro_text import KokoroVoices, kokoro_vocab
from mlxcel.backends.audio.speech import SpeechJob

logger = logging.getLogger(__name__)

KOKORO_RATE = 24_000
# The graph's inputs: the phoneme ids are `tokens` in kokoro-onnx's export (kokoro-v1.0.onnx)
# and `input_ids` in the onnx-community one.
ID_INPUTS = ("tokens", "input_ids")
STYLE, SPEED = "style", "speed"
_DTYPES = {"tensor(float)": np.float32, "tensor(int32)": np.int32, "tensor(int64)": np.int64}


@dataclass(frozen=True)
class KokoroOnnxFiles:
    """The graph and the voices file of one Kokoro ONNX model."""

    graph: Path
    voices: Path


def kokoro_onnx_files(path: Path) -> KokoroOnnxFiles | None:
    """The files of a Kokoro ONNX model given as its folder or its .onnx file (the voices file
    beside it: voices*.bin or *.npz); None if the path holds no .onnx graph. A graph without
    its voices file, or a folder with several graphs, raises ValueError saying so."""
    if path.is_file() and path.suffix == ".onnx":
        graph, folder = path, path.parent
    elif path.is_dir():
        graphs = sorted(path.glob("*.onnx"))
        if not graphs:
            return None
        if len(graphs) > 1:
            names = ", ".join(g.name for g in graphs)
            raise ValueError(f"{path} holds several ONNX graphs ({names}): give one of them")
        graph, folder = graphs[0], path
    else:
        return None
    voices = sorted({*folder.glob("voices*.bin"), *folder.glob("*.npz")})
    if not voices:
        raise ValueError(
            f"{graph} has no voices file beside it (voices-v1.0.bin, an .npz of style arrays)"
        )
    if len(voices) > 1:
        names = ", ".join(v.name for v in voices)
        raise ValueError(f"{folder} holds several voices files ({names}): keep one")
    return KokoroOnnxFiles(graph, voices[0])


def _styles(path: Path) -> dict[str, np.ndarray]:
    """Every voice of the file as [rows, 256] float32 (one style per phoneme count)."""
    try:
        with np.load(path) as found:
            styles = {name: np.asarray(found[name], np.float32) for name in found.files}
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path} is not a voices file (an .npz of style arrays): {exc}") from exc
    if not styles:
        raise ValueError(f"{path} holds no voices")
    for name, style in styles.items():
        if style.ndim != 3 or style.shape[1] != 1:
            raise ValueError(f"{path}: voice {name} has shape {style.shape}, not [rows, 1, width]")
    return {name: style[:, 0, :] for name, style in styles.items()}


class KokoroOnnxSynthesizer(KokoroVoices):
    """One ONNX Runtime session shared by concurrent requests, each on `threads` threads, and
    every voice of the voices file."""

    def __init__(self, files: KokoroOnnxFiles, threads: int = 1) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = options.inter_op_num_threads = threads
        options.log_severity_level = 3
        self._session = ort.InferenceSession(
            str(files.graph), options, providers=["CPUExecutionProvider"]
        )
        inputs = {i.name: i for i in self._session.get_inputs()}
        ids = [name for name in ID_INPUTS if name in inputs]
        if len(ids) != 1 or set(inputs) != {ids[0], STYLE, SPEED}:
            raise ValueError(
                f"{files.graph} takes {', '.join(inputs)}: not a Kokoro graph (tokens or "
                "input_ids, style, speed)"
            )
        self._ids = ids[0]
        self._speed = _DTYPES.get(inputs[SPEED].type, np.float32)
        self._styles = _styles(files.voices)
        width = inputs[STYLE].shape[-1]
        wrong = [n for n, s in self._styles.items() if s.shape[1] != width]
        if isinstance(width, int) and wrong:
            raise ValueError(f"{files.voices}: voices {', '.join(wrong)} are not {width} wide")
        super().__init__(list(self._styles), KOKORO_RATE, kokoro_vocab())
        logger.info("%s: %d Kokoro voices", files.graph.name, len(self._styles))

    def synthesize(self, job: SpeechJob) -> Iterator[np.ndarray]:
        """One array per sentence (or per piece of a long one), in order."""
        style = self._styles[job.voice]
        for phonemes in self._text.phonemes(job.text, job.voice):
            ids = self._text.ids(phonemes)
            feed: dict[str, Any] = {
                self._ids: np.asarray([[0, *ids, 0]], np.int64),
                STYLE: style[min(len(ids), len(style)) - 1][None, :],
                SPEED: np.asarray([job.speed], self._speed),
            }
            audio = np.asarray(self._session.run(None, feed)[0], np.float32).reshape(-1)
            if audio.size:
                yield audio

    def close(self) -> None:
        """Drop the session and the voices."""
        del self._session
        self._styles.clear()
