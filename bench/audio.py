"""Speech through the server against its engines in-process, in one run, on the same audio.

    python bench/audio.py

Transcription real-time factor (audio seconds per wall second) through POST
/v1/audio/transcriptions against faster-whisper in this process with the same model and
settings, each side decoding the same WAV bytes the same way (PyAV, to 16 kHz); 4 concurrent
transcriptions through the server against the same 4 one after another (on the server, and
in-process: the one-request-at-a-time peer, as whisper.cpp's server runs; each the best of as
many rounds as the real-time factor's); speech synthesis
real-time factor through POST /v1/audio/speech against the hibari engine in-process, each side
making the same response_format (pcm) of the same texts; and the time to the first audio byte
when streaming (the four texts as one mp3, the median of as many requests as speech rounds).
Prints each ratio. Speech is also timed through bench/bare.py (a bare ASGI app on uvicorn with
the voice on its event loop, in the same interleaved rounds): the ratio the least an HTTP
server can add here leaves, the ceiling of the server's own.

This process's allocator keeps freed memory as the server's workers do (memory.py):
without it, which is how a plain script runs faster-whisper, glibc maps and faults in Whisper's
54 MB attention matrices afresh on every request, and the in-process side here ran 1.5x slower
(or less, after other large frees here raised glibc's own threshold).

The server's figures are a client's whose request is ready (its multipart form or JSON body
encoded before the clock starts, sent over a kept-alive connection, as bench/vision.py's
headline), with the openai SDK's beside them, which build each request too (about 1 ms here;
no server can save it).

Both real-time factors are timed in interleaved rounds (server pass, in-process pass, again),
and each side's best round is the figure, its median beside it: on a shared machine other
processes only ever add time to a round, so a side's fastest round is the closest to its own
cost, where a median moves with the load (and under load favours the server, whose processes
sleep between requests and so win the scheduler's wake-ups over the in-process loop).

How 4 requests share the threads is chosen by the `strategies` lines, measured in-process in
the same run: one worker with every thread taking them in turn (what the server does when
`parallel` is 1), side by side on 2 or 4 CTranslate2 workers with a share of the threads each
(`parallel` 2, 4), and batched across requests (the 4 windows encoded and decoded as one
CTranslate2 batch, as faster-whisper's BatchedInferencePipeline batches one file's chunks),
faster-whisper's BatchedInferencePipeline on each request (VAD chunks batched within one file),
and one worker in float32 against int8.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import _free_port, _start

from mlxcel.backends.audio.defaults import packaged_transcription
from mlxcel.backends.audio.encode import AudioEncoder, encode_audio
from mlxcel.backends.audio.faster_whisper import (
    FasterWhisperTranscriber,
    WhisperOptions,
)
from mlxcel.backends.audio.hibari_voice import HibariSynthesizer
from mlxcel.backends.audio.speech import SpeechJob
from mlxcel.backends.audio.transcript import TranscribeJob
from mlxcel.config.cores import usable_cores
from mlxcel.config.engines import default_parallel
from mlxcel.media.decode import decode_audio
from mlxcel.memory import keep_freed_memory

FALLBACK = [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
TEXTS = (
    "The quick brown fox jumps over the lazy dog. She sells sea shells by the sea shore.",
    "Please send the report to the office by Friday morning, and call me when it is done.",
    "We will meet at the station at noon tomorrow, then walk together to the old museum.",
    "Bright sunlight fell across the quiet garden path as the children ran towards the gate.",
)
MLXCEL = str(Path(sys.executable).parent / "mlxcel")
BARE = Path(__file__).resolve().parent / "bare.py"
STT_ROUNDS = 3
TTS_ROUNDS = 5
MAX_SECONDS = 600


def timed(work: object) -> float:
    """Seconds `work()` takes."""
    started = time.perf_counter()
    work()  # type: ignore[operator]
    return time.perf_counter() - started


def interleaved(rounds: int, *sides: Any) -> list[list[float]]:
    """Seconds of each round of each side, the sides taken in turn in every round."""
    times = [[timed(side) for side in sides] for _ in range(rounds)]
    return [list(side) for side in zip(*times, strict=True)]


def rtf_line(what: str, seconds: float, rounds: list[list[float]]) -> str:
    """Real-time factors and their ratio, best round and median round of each side: the
    engine in-process, the server from a client whose request is ready, and from the SDK."""
    local, served, sdk = rounds
    best, middle = (min(local), min(served)), (statistics.median(local), statistics.median(served))
    return (
        f"{what} RTF (best of {len(local)} interleaved rounds): server {seconds / best[1]:.1f}x, "
        f"in-process {seconds / best[0]:.1f}x, ratio {best[0] / best[1]:.2f}; median rounds: "
        f"server {seconds / middle[1]:.1f}x, in-process {seconds / middle[0]:.1f}x, ratio "
        f"{middle[0] / middle[1]:.2f}; through the openai SDK {seconds / min(sdk):.1f}x, ratio "
        f"{best[0] / min(sdk):.2f}"
    )


def ready(http: httpx.Client, requests: list[httpx.Request]) -> list[bytes]:
    """The answers to requests whose bodies are encoded already (multipart forms, JSON)."""
    answers = [http.send(request) for request in requests]
    for answer in answers:
        answer.raise_for_status()
    return [answer.content for answer in answers]


def streamed_first_byte(client: openai.OpenAI) -> float:
    """Seconds to the first byte of the four texts as one streamed mp3 (read to its end)."""
    started = time.perf_counter()
    with client.audio.speech.with_streaming_response.create(
        model="tts-1", voice="heart", input=" ".join(TEXTS), response_format="mp3"
    ) as response:
        pieces = response.iter_bytes()
        first = next(pieces)
        took = time.perf_counter() - started
        assert first
        for _ in pieces:
            pass
    return took


def pcm_file(voice: HibariSynthesizer, text: str) -> bytes:
    """The text as the server answers response_format pcm: encoded sentence by sentence."""
    encoder = AudioEncoder("pcm", voice.sample_rate, streaming=True)
    pieces = [encoder.feed(samples) for samples in voice.synthesize(SpeechJob(text, "heart"))]
    return b"".join(pieces) + encoder.finish()


def _batched(model: Any, samples: list[np.ndarray]) -> list[str]:
    """The clips (each under 30 s) as one CTranslate2 batch: encoded together, then decoded
    together with the same beam as one at a time."""
    from faster_whisper.tokenizer import Tokenizer

    tokenizer = Tokenizer(model.hf_tokenizer, model.model.is_multilingual, "transcribe", "en")
    window = model.feature_extractor.n_samples
    features = np.stack(
        [model.feature_extractor(np.pad(s, (0, window - len(s))))[..., :3000] for s in samples]
    )
    prompt = model.get_prompt(tokenizer, [], without_timestamps=False)
    results = model.model.generate(
        model.encode(features), [prompt] * len(samples), beam_size=5, max_length=448
    )
    return [tokenizer.decode([t for t in r.sequences_ids[0] if t < tokenizer.eot]) for r in results]


def _at_once(work: Any, items: list[Any]) -> list[Any]:
    with ThreadPoolExecutor(len(items)) as pool:
        return list(pool.map(work, items))


def strategies(path: Path, threads: int, samples: list[np.ndarray]) -> dict[str, float]:
    """Seconds for the clips, 4 at once, each way of sharing `threads` (see the docstring)."""
    from faster_whisper import BatchedInferencePipeline, WhisperModel

    def run(model: Any, clip: np.ndarray) -> str:
        segments, _ = model.transcribe(clip, beam_size=5, temperature=FALLBACK, language="en")
        return "".join(s.text for s in segments)

    def opened(workers: int, compute_type: str = "int8") -> Any:
        per = max(1, threads // workers)
        return WhisperModel(
            str(path), "cpu", compute_type=compute_type, cpu_threads=per, num_workers=workers
        )

    def pipeline(model: Any, clip: np.ndarray) -> str:
        segments, _ = BatchedInferencePipeline(model).transcribe(
            clip, beam_size=5, batch_size=len(samples), language="en"
        )
        return "".join(s.text for s in segments)

    found: dict[str, float] = {}
    for workers in (1, 2, 4):
        model = opened(workers)
        run(model, samples[0])
        found[f"{workers} worker(s)"] = timed(partial(_at_once, partial(run, model), samples))
        if workers == 1:
            _batched(model, samples)
            found["batched across requests"] = timed(partial(_batched, model, samples))
            pipeline(model, samples[0])
            found["BatchedInferencePipeline per request"] = timed(
                partial(_at_once, partial(pipeline, model), samples)
            )
    model = opened(1, "float32")
    run(model, samples[0])
    found["float32, 1 worker"] = timed(partial(_at_once, partial(run, model), samples))
    return found


def main() -> None:
    # The server's workers keep freed memory for reuse (memory.py); so does this side.
    keep_freed_memory()
    threads = usable_cores()
    voice = HibariSynthesizer()
    clips = [np.concatenate(list(voice.synthesize(SpeechJob(t, "heart")))) for t in TEXTS]
    wavs = [encode_audio(clip, voice.sample_rate, "wav") for clip in clips]
    seconds = sum(len(c) for c in clips) / voice.sample_rate
    samples = [decode_audio(w, MAX_SECONDS).samples for w in wavs]
    shares = strategies(packaged_transcription("default"), threads, samples)  # type: ignore[arg-type]
    engine = FasterWhisperTranscriber(
        packaged_transcription("default"),  # type: ignore[arg-type]
        WhisperOptions(threads=threads, parallel=default_parallel(threads)),
    )

    def local_stt() -> list[list[Any]]:
        jobs = [TranscribeJob(decode_audio(w, MAX_SECONDS).samples) for w in wavs]
        return [list(engine.transcribe(job)) for job in jobs]

    def local_tts() -> list[bytes]:
        return [pcm_file(voice, t) for t in TEXTS]

    local_stt()
    port = _free_port()
    command = [MLXCEL, "serve", "--port", str(port), "--transcription-model", "default"]
    server = _start([*command, "--speech-model", "default"], port, "/health")
    http = httpx.Client(base_url=f"http://127.0.0.1:{port}/v1", timeout=MAX_SECONDS)
    bare_port = _free_port()
    bare = _start([sys.executable, str(BARE), "speech", str(bare_port)], bare_port, "/health")
    bare_http = httpx.Client(base_url=f"http://127.0.0.1:{bare_port}/v1", timeout=MAX_SECONDS)
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x")
        stt_requests = [
            http.build_request("POST", "/audio/transcriptions", files={"file": ("a.wav", w)},
                               data={"model": "whisper-1"})
            for w in wavs
        ]  # fmt: skip
        tts_requests = [
            http.build_request("POST", "/audio/speech", json={"model": "tts-1", "voice": "heart",
                               "input": t, "response_format": "pcm"})
            for t in TEXTS
        ]  # fmt: skip
        bare_requests = [bare_http.build_request("POST", "/audio/speech", json=r) for r in
                         (json.loads(request.read()) for request in tts_requests)]  # fmt: skip
        for request in [*stt_requests, *tts_requests, *bare_requests]:
            request.read()

        def stt(wav: bytes) -> str:
            return client.audio.transcriptions.create(model="whisper-1", file=("a.wav", wav)).text

        def tts(text: str) -> bytes:
            return client.audio.speech.create(
                model="tts-1", voice="heart", input=text, response_format="pcm"
            ).read()

        stt(wavs[0])
        tts(TEXTS[0])
        if ready(bare_http, bare_requests[:1]) != ready(http, tts_requests[:1]):
            raise RuntimeError("bench/bare.py's pcm is not the server's")
        stt_rounds = interleaved(
            STT_ROUNDS,
            local_stt,
            partial(ready, http, stt_requests),
            lambda: [stt(w) for w in wavs],
        )
        stt_load = os.getloadavg()[0]
        served_stt = min(stt_rounds[1])
        at_once = partial(_at_once, lambda request: ready(http, [request]), stt_requests)
        concurrent = min(timed(at_once) for _ in range(STT_ROUNDS))
        tts_rounds = interleaved(
            TTS_ROUNDS,
            local_tts,
            partial(ready, http, tts_requests),
            lambda: [tts(t) for t in TEXTS],
            partial(ready, bare_http, bare_requests),
        )
        tts_load = os.getloadavg()[0]
        first_byte = statistics.median(streamed_first_byte(client) for _ in range(TTS_ROUNDS))
    finally:
        http.close()
        bare_http.close()
        for process in (server, bare):
            process.terminate()
            process.wait()
        voice.close()
        engine.close()

    print(f"audio: {len(TEXTS)} clips, {seconds:.1f} s in all, {threads} threads")
    print(rtf_line("transcription", seconds, stt_rounds) + f" (load {stt_load:.1f})")
    print(
        f"4 concurrent vs one after another: {served_stt:.2f} s / {concurrent:.2f} s, "
        f"aggregate ratio {served_stt / concurrent:.2f}; against in-process one after another "
        f"(the one-at-a-time peer) {min(stt_rounds[0]) / concurrent:.2f}"
    )
    serial = shares["1 worker(s)"]
    print(
        f"strategies, 4 at once in-process ({threads} threads): "
        + ", ".join(f"{name} {took:.2f} s ({serial / took:.2f}x)" for name, took in shares.items())
        + f"; the server runs {default_parallel(threads)} worker(s)"
    )
    print(
        rtf_line("speech", seconds, tts_rounds[:3])
        + f" (load {tts_load:.1f}); first audio byte streaming {first_byte * 1000:.0f} ms "
        f"(median of {TTS_ROUNDS})"
    )
    local, served, floor = tts_rounds[0], tts_rounds[1], tts_rounds[3]
    middle = statistics.median(local) / statistics.median(floor)
    print(
        f"speech, the floor (bench/bare.py: the voice on a bare uvicorn app's loop): ratio "
        f"{min(local) / min(floor):.2f} best rounds, {middle:.2f} median rounds; the server's "
        f"best round takes {min(served) / min(floor):.3f}x the floor's"
    )


if __name__ == "__main__":
    main()
