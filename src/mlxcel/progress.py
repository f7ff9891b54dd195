"""A seconds counter on the terminal while a long step (model load, warm-up) runs."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

# Steps quicker than this print nothing: the log line before them says what is happening.
SHOW_AFTER_S = 1.5


@contextmanager
def progress(what: str, stream: TextIO | None = None) -> Iterator[None]:
    """On a terminal, `what... Ns` counting up once the block runs past SHOW_AFTER_S, then
    `what: done after Ns` (or `failed`); elsewhere (a pipe, a log file) nothing."""
    out = stream or sys.stderr
    if not out.isatty():
        yield
        return
    started = time.monotonic()
    done = threading.Event()
    shown = threading.Event()

    def count() -> None:
        if done.wait(SHOW_AFTER_S):
            return
        shown.set()
        while True:
            out.write(f"\r{what}... {time.monotonic() - started:.0f}s")
            out.flush()
            if done.wait(1.0):
                return

    counter = threading.Thread(target=count, name="progress", daemon=True)
    counter.start()
    outcome = "failed"
    try:
        yield
        outcome = "done"
    finally:
        done.set()
        counter.join()
        if shown.is_set():
            out.write(f"\r{what}: {outcome} after {time.monotonic() - started:.1f}s\n")
            out.flush()
