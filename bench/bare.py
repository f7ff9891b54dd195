"""The least an HTTP server can add here: a bare ASGI app on uvicorn with the engine in its
own process, the floor the speech and vision benchmarks print beside mlxcel.

    python bench/bare.py speech PORT
    python bench/bare.py vision PORT TEXT_GGUF MMPROJ_GGUF

It answers the benchmark's own request and nothing else, with nothing a server needs around
it: no framework, no validation, no worker process (the engine runs on the event loop, which
no real server may do, so that no thread or process hop is counted), served by uvicorn's h11
protocol as `mlxcel serve` is. `speech` answers POST /v1/audio/speech with the pcm of the
body's `input`, made as bench/audio.py's in-process side makes it, whole, with its length;
`vision` answers POST /v1/chat/completions with one SSE chunk once the first token is sampled
by bench/vision.py's in-process path, from the image in the body's data: URI. Both answer GET
/health. What it takes beyond the in-process figure is this machine's cost of an HTTP request:
the wake-ups of a client and a server that waited idle, h11 and httpx, the bytes over loopback.
"""

from __future__ import annotations

import base64
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import uvicorn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

Answer = tuple[bytes, bytes]
"""A response's content type and body."""


def speech_answer() -> Callable[[dict[str, Any]], Answer]:
    """The pcm of a speech request's input, by hibari in this process."""
    from bench.audio import pcm_file

    from mlxcel.backends.audio.hibari_voice import HibariSynthesizer

    voice = HibariSynthesizer()
    return lambda body: (b"audio/pcm", pcm_file(voice, body["input"]))


def vision_answer(text: Path, mmproj: Path) -> Callable[[dict[str, Any]], Answer]:
    """One chat chunk once the first token of the image's question is sampled."""
    from bench.vision import BATCH, CTX, in_process

    from mlxcel.backends.llamacpp.generator import LlamaCppGenerator, LlamaCppOptions

    generator = LlamaCppGenerator(text, LlamaCppOptions(CTX, 1, 1, BATCH, BATCH, mmproj=mmproj))
    chunk = {"choices": [{"index": 0, "delta": {"content": "x"}, "finish_reason": "length"}]}
    events = f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n".encode()

    def answer(body: dict[str, Any]) -> Answer:
        question, image = body["messages"][0]["content"]
        data = base64.b64decode(image["image_url"]["url"].partition(",")[2])
        in_process(generator, data, question["text"])
        return b"text/event-stream", events

    return answer


def app_for(answer: Callable[[dict[str, Any]], Answer]) -> Any:
    """The ASGI app: GET /health, and `answer` for any POST."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = bytearray()
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        kind, content = (b"text/plain", b"ok") if scope["method"] == "GET" else answer(
            json.loads(body)
        )  # fmt: skip
        headers = [(b"content-type", kind), (b"content-length", str(len(content)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": content})

    return app


def main(argv: list[str]) -> None:
    from mlxcel.memory import keep_freed_memory

    # As the server's workers do (memory.py): large buffers are reused, not faulted in
    # afresh on every request.
    keep_freed_memory()
    kind, port = argv[1], int(argv[2])
    answer = speech_answer() if kind == "speech" else vision_answer(Path(argv[3]), Path(argv[4]))
    uvicorn.run(
        app_for(answer), host="127.0.0.1", port=port, http="h11", log_level="warning",
        access_log=False,
    )  # fmt: skip


if __name__ == "__main__":
    main(sys.argv)
