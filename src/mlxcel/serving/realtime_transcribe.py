"""A turn's transcript while it is spoken: the turn's audio re-decoded every PARTIAL_EVERY_S
of new audio and when the speaker pauses, the words two decodes in a row agree on sent as
`conversation.item.input_audio_transcription.delta`, and the last decode reused as the final
transcript when it heard all the speech (so the transcript follows the end of speech at once).

Past WINDOW_S of audio the decoded window slides: the segments before the last one are fixed
(their words sent), and decoding starts after them with their text as Whisper's prompt."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import numpy as np

from mlxcel.backends.audio.transcript import TranscribeJob
from mlxcel.backends.audio.voice_activity import VAD_RATE
from mlxcel.models.audio import TranscriptionModel
from mlxcel.protocol.errors import APIError
from mlxcel.protocol.realtime import Transcription
from mlxcel.serving.audio_formats import Transcript
from mlxcel.serving.audio_transcription import transcribe

logger = logging.getLogger(__name__)

PARTIAL_EVERY_S = 1.0
"""New audio between partial decodes, which are greedy; a pause's decode is the full one
(beam 5), reused as the transcript when the turn ends there (bench/realtime.py)."""
WINDOW_S = 20.0
"""The longest window a partial decode reads before it slides."""
_WORD = re.compile(r"[^\w']+")


def _norm(word: str) -> str:
    return _WORD.sub("", word.lower())


def _agreed(a: list[str], b: list[str]) -> int:
    """How many leading words two hypotheses share."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if _norm(x) != _norm(y):
            break
        n += 1
    return n


@dataclass
class _Decode:
    start: int
    """Where in the turn the decoded window starts (16 kHz samples)."""
    end: int
    draft: bool
    """Greedy (a partial while the speech goes on), not the full decode a pause gets."""
    task: asyncio.Task[Transcript] = field(init=False)


class LiveTranscript:
    """One turn's partial decodes and its final transcript."""

    def __init__(
        self,
        model: TranscriptionModel,
        hints: Transcription,
        audio: Callable[[], np.ndarray],
        send_delta: Callable[[str], Awaitable[None]],
    ) -> None:
        self._model = model
        self._hints = hints
        self.audio = audio
        self._send_delta = send_delta
        self._decode: _Decode | None = None
        self._last: tuple[_Decode, Transcript] | None = None
        self._previous: list[str] = []
        self.sent: list[str] = []
        """The words sent as deltas so far."""
        self._anchor = 0
        self._fixed: list[str] = []
        self._length = 0
        self._again = False
        self._final = False

    def _job(self, audio: np.ndarray, prompt: str | None, draft: bool = False) -> TranscribeJob:
        language = self._hints.language
        return TranscribeJob(audio=audio, language=language, prompt=prompt, draft=draft)

    def _prompt(self) -> str | None:
        fixed = " ".join(self._fixed)[-600:]
        hint = self._hints.prompt or ""
        return (f"{hint} {fixed}".strip()) or None

    def grew(self, length: int, paused: bool = False) -> None:
        """The turn now holds `length` samples: decode again if enough is new (or the speaker
        paused) and no decode is running."""
        self._length = length
        if self._decode is not None and not self._decode.task.done():
            # The pause's decode starts as soon as this one ends: it hears the speech whole.
            self._again = self._again or paused
            return
        done = self._last[0].end if self._last else 0
        if not paused and length - done < PARTIAL_EVERY_S * VAD_RATE:
            return
        self._start(length, draft=not paused)

    def _start(self, length: int, draft: bool) -> None:
        if self._final:
            return
        audio = self.audio()[self._anchor : length]
        decode = _Decode(self._anchor, length, draft)
        decode.task = asyncio.ensure_future(self._partial(decode, audio))
        self._decode = decode

    async def _partial(self, decode: _Decode, audio: np.ndarray) -> Transcript:
        try:
            job = self._job(audio, self._prompt(), decode.draft)
            transcript = await transcribe(self._model, job)
        except (APIError, RuntimeError) as exc:
            logger.warning("a partial transcript failed: %s", exc)
            raise
        self._last = (decode, transcript)
        await self._agree(decode, transcript)
        if self._again:
            self._again = False
            asyncio.get_running_loop().call_soon(self._start, self._length, False)
        return transcript

    async def _agree(self, decode: _Decode, transcript: Transcript) -> None:
        words = self._fixed + transcript.text.split()
        agreed = _agreed(self._previous, words)
        self._previous = words
        await self._send_upto(words, agreed)
        self._slide(decode, transcript)

    async def _send_upto(self, words: list[str], count: int) -> None:
        """Send words[len(sent):count] if what was sent is still how `words` begin."""
        if count <= len(self.sent) or _agreed(self.sent, words) < len(self.sent):
            return
        new = " ".join(words[len(self.sent) : count])
        delta = f" {new}" if self.sent else new
        self.sent = words[:count]
        await self._send_delta(delta)

    def _slide(self, decode: _Decode, transcript: Transcript) -> None:
        """Past WINDOW_S, fix the window's segments but its last and decode after them."""
        if (decode.end - decode.start) < WINDOW_S * VAD_RATE or len(transcript.segments) < 2:
            return
        kept = transcript.segments[:-1]
        self._anchor = decode.start + int(kept[-1].end * VAD_RATE)
        self._fixed = self._fixed + " ".join(s.text.strip() for s in kept).split()
        self._previous = list(self._fixed)

    async def final(self, length: int, speech_end: int | None) -> str:
        """The turn's transcript (its first `length` samples): the last decode's when it heard
        all the speech (to `speech_end`), else one more; the words not yet sent go as a last
        delta when what was sent agrees with it."""
        self._final = True
        decode = self._decode
        if decode is not None and not decode.task.done():
            if speech_end is None or decode.end < speech_end or decode.draft:
                decode.task.cancel()
            else:
                await asyncio.wait([decode.task])
        if decode is not None and decode.task.done() and not decode.task.cancelled():
            decode.task.exception()  # seen: a failed partial leaves the final to decode
        last = self._last
        covers = speech_end is not None and last is not None and last[0].end >= speech_end
        if covers and last is not None and last[0].start == self._anchor and not last[0].draft:
            transcript = last[1]
        else:
            audio = self.audio()[self._anchor : length]
            transcript = await transcribe(self._model, self._job(audio, self._prompt()))
        words = self._fixed + transcript.text.split()
        await self._send_upto(words, len(words))
        return " ".join(words)

    def cancel(self) -> None:
        """Stop a partial decode in flight (the turn was cleared)."""
        if self._decode is not None:
            self._decode.task.cancel()
