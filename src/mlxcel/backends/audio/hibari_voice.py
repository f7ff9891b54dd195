"""The Kokoro-distilled ONNX voices of the hibari-tts package (numpy and onnxruntime only)."""

from __future__ import annotations

import logging
import re
import unicodedata
from collections import deque
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from mlxcel.backends.audio.speech import SpeechJob, Voice

logger = logging.getLogger(__name__)

# The noise in hibari's vocoder is drawn from this seed, so the same request is the same audio.
NOISE_SEED = 0
# Sentences whose network output may wait for the vocoder (some 5 MB each for 5 s of speech).
AHEAD = 2
# hibari's number reader names groups of three digits up to decillions and fails (IndexError)
# on a longer integer part, 37 digits or more; such a number is read digit by digit instead.
_WORD = re.compile(r"[^\W_]+(?:[,.][^\W_]+)*")
_TOO_LONG_NUMBER = re.compile(r"[0-9](?:[,.]?[0-9]){36,}")


def hibari_assets() -> Path:
    """The package's asset folder: the default voice's ONNX model and its G2P tables."""
    import hibari

    return Path(hibari.__file__).parent / "assets"


def readable_numbers(text: str) -> str:
    """The text with each number too long for hibari's number reader (37 digits or more,
    commas and points between them allowed) written as its digits apart, which it reads one
    by one. Digits are compared as hibari's lexicon reads them (NFKC, any script's digits),
    so a number it would see as too long is found whatever characters spell it."""

    def digits_apart(number: re.Match[str]) -> str:
        return " ".join(c for c in number.group() if c.isdigit())

    def one(word: re.Match[str]) -> str:
        ascii_word = "".join(
            str(int(unicodedata.numeric(c))) if c.isdigit() else c
            for c in unicodedata.normalize("NFKC", word.group())
        )
        if not _TOO_LONG_NUMBER.search(ascii_word):
            return word.group()
        return _TOO_LONG_NUMBER.sub(digits_apart, ascii_word)

    return _WORD.sub(one, text)


class HibariSynthesizer:
    """Every hibari voice already on this machine (the packaged one, and any in its cache);
    no voice is downloaded. One ONNX session per voice, shared by concurrent requests."""

    def __init__(self, threads: int = 1) -> None:
        from hibari import Hibari
        from hibari.voices import DEFAULT, VOICES, voice_path

        self._catalog: dict[str, dict[str, Any]] = VOICES
        self._default = DEFAULT
        self._voices: dict[str, Any] = {}
        shared_g2p: dict[bool, Any] = {}
        for name, info in VOICES.items():
            try:
                path = voice_path(name, download_missing=False)
            except FileNotFoundError:
                continue
            british = bool(info["british"])
            voice = Hibari(voice=name, model=path, threads=threads, g2p=shared_g2p.get(british))
            shared_g2p[british] = voice.g2p
            self._voices[name] = voice
        logger.info("hibari voices present: %s", ", ".join(self._voices))
        self._rate = int(self._voices[DEFAULT].sample_rate)

    @property
    def sample_rate(self) -> int:
        """24 kHz."""
        return self._rate

    @property
    def default_voice(self) -> str:
        """The packaged voice."""
        return self._default

    def voices(self) -> list[Voice]:
        """Every voice hibari knows; `present` for those that are here."""
        return [
            Voice(
                id=name,
                name=f"{info['accent']} {info['gender']} (Kokoro {info['kokoro']})",
                language=str(info["language"]),
                gender=str(info["gender"]),
                present=name in self._voices,
            )
            for name, info in self._catalog.items()
        ]

    def synthesize(self, job: SpeechJob) -> Iterator[np.ndarray]:
        """One array per sentence, in order: the samples of hibari's own `stream`, made in a
        pipeline. The network (ONNX) takes 60% of a sentence's time and the vocoder (numpy,
        which draws the noise from one generator, sentence after sentence) the rest, and both
        let go of the GIL: the network runs on the next sentence while the vocoder makes this
        one, so a text of several sentences is ready sooner (the bench's four texts, 5
        sentences: 68-87 ms against 109-120 ms one after the other, here)."""
        from hibari import dsp

        voice = self._voices[job.voice]
        rng = np.random.default_rng(NOISE_SEED)
        speed = np.asarray([job.speed], np.float32)

        def network(phonemes: str) -> list[np.ndarray] | None:
            ids = voice.ids(phonemes)
            if len(ids) < 3:  # nothing the model can say (hibari answers no samples)
                return None
            outputs = voice.sess.run(None, {"ids": np.asarray([ids], np.int64), "speed": speed})
            return [o[0] for o in outputs]

        sentences = voice.phonemize(readable_numbers(job.text))
        if not sentences:
            return
        # The first sentence's network runs here and alone (nothing delays the first audio,
        # and a one-sentence text takes no hop to a thread); the next ones' on a thread, at
        # most AHEAD of them waiting there.
        outputs = network(sentences[0])
        ahead = ThreadPoolExecutor(1, thread_name_prefix="hibari-network")
        try:
            upcoming = deque(ahead.submit(network, s) for s in sentences[1 : 1 + AHEAD])
            submitted = 1 + len(upcoming)
            while True:
                if outputs is not None:
                    samples = dsp.synth(*outputs, rng)
                    if samples.size:
                        yield samples.astype(np.float32, copy=False)
                if not upcoming:
                    return
                outputs = upcoming.popleft().result()
                if submitted < len(sentences):
                    upcoming.append(ahead.submit(network, sentences[submitted]))
                    submitted += 1
        finally:
            ahead.shutdown(wait=True, cancel_futures=True)

    def close(self) -> None:
        """Drop the sessions."""
        self._voices.clear()
