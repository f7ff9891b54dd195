"""Speech through the server against its engines in-process, in one run, on the same audio.

    python bench/audio.py

Transcription real-time factor (audio seconds per wall second) through POST
/v1/audio/transcriptions against faster-whisper in this process with the same model and
settings; 4 concurrent transcriptions against the same 4 one after another; speech synthesis
real-time factor through POST /v1/audio/speech against the hibari engine in-process, and the
time to the first audio byte when streaming. Prints each ratio (server / in-process).
"""

from __future__ import annotations

import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import openai

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import _free_port, _start

from mlxcel.backends.audio.decode import decode_audio
from mlxcel.backends.audio.defaults import packaged_transcription
from mlxcel.backends.audio.encode import encode_audio
from mlxcel.backends.audio.faster_whisper import (
    FasterWhisperTranscriber,
    WhisperOptions,
)
from mlxcel.backends.audio.hibari_voice import HibariSynthesizer
from mlxcel.backends.audio.speech import SpeechJob
from mlxcel.backends.audio.transcript import TranscribeJob
from mlxcel.config import default_threads
from mlxcel.models.audio import default_parallel

TEXTS = (
    "The quick brown fox jumps over the lazy dog. She sells sea shells by the sea shore.",
    "Please send the report to the office by Friday morning, and call me when it is done.",
    "We will meet at the station at noon tomorrow, then walk together to the old museum.",
    "Bright sunlight fell across the quiet garden path as the children ran towards the gate.",
)
MLXCEL = str(Path(sys.executable).parent / "mlxcel")


def timed(work: object) -> float:
    """Seconds `work()` takes."""
    started = time.perf_counter()
    work()  # type: ignore[operator]
    return time.perf_counter() - started


def main() -> None:
    threads = default_threads()
    voice = HibariSynthesizer()
    clips = [np.concatenate(list(voice.synthesize(SpeechJob(t, "heart")))) for t in TEXTS]
    wavs = [encode_audio(clip, voice.sample_rate, "wav") for clip in clips]
    seconds = sum(len(c) for c in clips) / voice.sample_rate
    engine = FasterWhisperTranscriber(
        packaged_transcription("default"),  # type: ignore[arg-type]
        WhisperOptions(threads=threads, parallel=default_parallel(threads)),
    )
    samples = [decode_audio(w, 600).samples for w in wavs]
    list(engine.transcribe(TranscribeJob(samples[0])))
    local_stt = timed(lambda: [list(engine.transcribe(TranscribeJob(s))) for s in samples])
    engine.close()
    local_tts = timed(lambda: [list(voice.synthesize(SpeechJob(t, "heart"))) for t in TEXTS])
    voice.close()

    port = _free_port()
    command = [MLXCEL, "serve", "--port", str(port), "--transcription-model", "default"]
    server = _start([*command, "--speech-model", "default"], port, "/health")
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x")

        def stt(wav: bytes) -> str:
            return client.audio.transcriptions.create(model="whisper-1", file=("a.wav", wav)).text

        def tts(text: str) -> bytes:
            return client.audio.speech.create(
                model="tts-1", voice="heart", input=text, response_format="pcm"
            ).read()

        stt(wavs[0])
        served_stt = timed(lambda: [stt(w) for w in wavs])
        with ThreadPoolExecutor(len(wavs)) as pool:
            concurrent = timed(lambda: list(pool.map(stt, wavs)))
        served_tts = timed(lambda: [tts(t) for t in TEXTS])
        started = time.perf_counter()
        with client.audio.speech.with_streaming_response.create(
            model="tts-1", voice="heart", input=" ".join(TEXTS), response_format="mp3"
        ) as response:
            first = next(response.iter_bytes())
            first_byte = time.perf_counter() - started
            assert first
    finally:
        server.terminate()
        server.wait()

    print(f"audio: {len(TEXTS)} clips, {seconds:.1f} s in all, {threads} threads")
    print(
        f"transcription RTF: server {seconds / served_stt:.2f}x, in-process "
        f"{seconds / local_stt:.2f}x, ratio {local_stt / served_stt:.2f}"
    )
    print(
        f"4 concurrent vs one after another: {served_stt:.2f} s / {concurrent:.2f} s, "
        f"aggregate ratio {served_stt / concurrent:.2f}"
    )
    print(
        f"speech RTF: server {seconds / served_tts:.1f}x, in-process {seconds / local_tts:.1f}x, "
        f"ratio {local_tts / served_tts:.2f}; first audio byte streaming {first_byte * 1000:.0f} ms"
    )


if __name__ == "__main__":
    main()
