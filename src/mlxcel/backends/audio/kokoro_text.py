"""Text to Kokoro's phoneme ids without a GPL runtime: the English G2P that hibari-tts brings
(its port of misaki's, the G2P Kokoro v1.0 was trained with; no espeak-ng), shared by every
Kokoro engine here. Kokoro's voices-file names say each voice's language and gender."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from typing import Any

from mlxcel.backends.audio.hibari_voice import readable_numbers
from mlxcel.backends.audio.speech import Voice

# Phonemes one Kokoro call reads: its 512 positions less the two pads around them.
KOKORO_CONTEXT = 510
# A Kokoro voice's first letter is its language, its second its gender (af_heart: American
# English, female).
LANGUAGES = {
    "a": "en-US",
    "b": "en-GB",
    "e": "es",
    "f": "fr",
    "h": "hi",
    "i": "it",
    "j": "ja",
    "p": "pt-BR",
    "z": "zh",
}
GENDERS = {"f": "female", "m": "male"}
# The voice OpenAI's names mean when the voices file has it (Kokoro's own default).
KOKORO_DEFAULT = "af_heart"
_CLAUSE = re.compile(r"(?<=[,;:—])\s+")


def kokoro_vocab() -> dict[str, int]:
    """Kokoro's phoneme vocabulary (178 ids), as hibari ships it: hibari's is Kokoro's."""
    from mlxcel.backends.audio.hibari_voice import hibari_assets

    vocab: dict[str, int] = json.loads((hibari_assets() / "vocab.json").read_text("utf-8"))
    return vocab


def kokoro_voice(name: str) -> Voice:
    """A voice of a Kokoro voices file, its language and gender read from its name."""
    language = LANGUAGES.get(name[:1], "unknown")
    gender = GENDERS.get(name[1:2], "unknown")
    return Voice(name, f"{language} {gender}", language, gender, present=True)


def _fit(phonemes: str) -> Iterator[str]:
    """A sentence's phonemes in pieces of at most KOKORO_CONTEXT, cut at clause punctuation
    where it can be and at the limit where it cannot."""
    if len(phonemes) <= KOKORO_CONTEXT:
        yield phonemes
        return
    piece = ""
    for clause in _CLAUSE.split(phonemes):
        if piece and len(piece) + 1 + len(clause) > KOKORO_CONTEXT:
            yield piece
            piece = ""
        piece = f"{piece} {clause}" if piece else clause
        while len(piece) > KOKORO_CONTEXT:
            yield piece[:KOKORO_CONTEXT]
            piece = piece[KOKORO_CONTEXT:]
    if piece:
        yield piece


class KokoroPhonemizer:
    """hibari's English G2P: American for every voice but the British ones (b*), each loaded
    on first use (about 3 s) and shared by concurrent requests. Text in another language is
    read as English."""

    def __init__(self, vocab: dict[str, int]) -> None:
        self._vocab = vocab
        self._g2p: dict[bool, Any] = {}
        self._lock = threading.Lock()

    def warm(self, voice: str) -> None:
        """Load the G2P a voice uses now, not at its first request."""
        self._for(voice)

    def _for(self, voice: str) -> Any:
        british = voice.startswith("b")
        with self._lock:
            if british not in self._g2p:
                from hibari.g2p import G2P

                self._g2p[british] = G2P(british=british)
            return self._g2p[british]

    def phonemes(self, text: str, voice: str) -> Iterator[str]:
        """The text's phonemes, sentence by sentence, each piece short enough for one call
        and holding only phonemes in the vocabulary."""
        from hibari import Hibari

        g2p = self._for(voice)
        for sentence in Hibari.split_sentences(readable_numbers(text)):
            known = "".join(c for c in g2p(sentence) if c in self._vocab)
            for piece in _fit(known):
                if piece.strip():
                    yield piece

    def ids(self, phonemes: str) -> list[int]:
        """A piece's phoneme ids, without the pads."""
        return [self._vocab[c] for c in phonemes]


class KokoroVoices:
    """What every Kokoro engine here shares: its voices (af_heart the default where present,
    else the first by name), its sample rate and its phonemizer, warm for the default voice."""

    def __init__(self, names: list[str], rate: int, vocab: dict[str, int]) -> None:
        self._names = sorted(names)
        self._rate = rate
        self._default = KOKORO_DEFAULT if KOKORO_DEFAULT in names else self._names[0]
        self._text = KokoroPhonemizer(vocab)
        self._text.warm(self._default)

    @property
    def sample_rate(self) -> int:
        """Samples per second (24 kHz for Kokoro)."""
        return self._rate

    @property
    def default_voice(self) -> str:
        """af_heart, or the first voice by name."""
        return self._default

    def voices(self) -> list[Voice]:
        """Every voice the model has, all present."""
        return [kokoro_voice(name) for name in self._names]
