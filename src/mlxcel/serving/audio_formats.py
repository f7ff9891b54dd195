"""A finished transcript in each of OpenAI's response formats."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from mlxcel.backends.audio.languages import language_name
from mlxcel.backends.audio.transcript import Segment, Task, TranscriptInfo, Word


@dataclass(frozen=True)
class Transcript:
    """Everything a transcription decoded."""

    task: Task
    info: TranscriptInfo
    segments: tuple[Segment, ...]

    @property
    def text(self) -> str:
        """The segments' text, joined as Whisper spaces it."""
        return "".join(segment.text for segment in self.segments).strip()

    @property
    def words(self) -> list[Word]:
        """Every word with its times, in order."""
        return [word for segment in self.segments for word in segment.words]


def duration_usage(info: TranscriptInfo) -> dict[str, Any]:
    """Usage as whisper-1 reports it: whole seconds of input audio."""
    return {"type": "duration", "seconds": math.ceil(info.duration)}


def word_logprobs(words: list[Word]) -> list[dict[str, Any]]:
    """Logprobs per word, from the engine's word probabilities (it gives none per token)."""
    return [
        {
            "token": word.word,
            "logprob": math.log(max(word.probability, 1e-12)),
            "bytes": list(word.word.encode()),
        }
        for word in words
    ]


def json_body(transcript: Transcript, logprobs: bool) -> dict[str, Any]:
    """response_format json."""
    body: dict[str, Any] = {"text": transcript.text}
    if logprobs:
        body["logprobs"] = word_logprobs(transcript.words)
    body["usage"] = duration_usage(transcript.info)
    return body


def verbose_body(transcript: Transcript, segments: bool, words: bool) -> dict[str, Any]:
    """response_format verbose_json: the language by name, the duration, segments and words."""
    body: dict[str, Any] = {
        "task": transcript.task,
        "language": language_name(transcript.info.language),
        "duration": transcript.info.duration,
        "text": transcript.text,
    }
    if words:
        body["words"] = [
            {"word": w.word.strip(), "start": w.start, "end": w.end} for w in transcript.words
        ]
    if segments:
        body["segments"] = [_segment(s) for s in transcript.segments]
    body["usage"] = duration_usage(transcript.info)
    return body


def _segment(segment: Segment) -> dict[str, Any]:
    return {
        "id": segment.id,
        "seek": segment.seek,
        "start": segment.start,
        "end": segment.end,
        "text": segment.text,
        "tokens": list(segment.tokens),
        "temperature": segment.temperature,
        "avg_logprob": segment.avg_logprob,
        "compression_ratio": segment.compression_ratio,
        "no_speech_prob": segment.no_speech_prob,
    }


def _timestamp(seconds: float, separator: str) -> str:
    millis = round(seconds * 1000)
    hours, millis = divmod(millis, 3_600_000)
    minutes, millis = divmod(millis, 60_000)
    secs, millis = divmod(millis, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{separator}{millis:03d}"


def srt(transcript: Transcript) -> str:
    """SubRip: numbered cues, `HH:MM:SS,mmm` times."""
    cues = [
        f"{index}\n{_timestamp(s.start, ',')} --> {_timestamp(s.end, ',')}\n{s.text.strip()}\n"
        for index, s in enumerate(transcript.segments, start=1)
    ]
    return "\n".join(cues)


def vtt(transcript: Transcript) -> str:
    """WebVTT: a header, then `HH:MM:SS.mmm` cues."""
    cues = [
        f"{_timestamp(s.start, '.')} --> {_timestamp(s.end, '.')}\n{s.text.strip()}\n"
        for s in transcript.segments
    ]
    return "\n".join(["WEBVTT\n", *cues])
