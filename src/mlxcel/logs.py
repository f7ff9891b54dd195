"""The server's log lines: text or JSON, each line about a request tagged with its id.

A request's id lives in a context variable for the lines written while it is handled (worker
threads and stream tasks copy it); the engine thread, which serves every request, passes it
as `extra={"request_id": ...}`. Structured fields travel as `extra={"fields": {...}}`: JSON
keys, or `key=value` after a text line; `extra={"http": {...}}` are JSON keys only, for what a
text line's message already says (the access line's method, path and status).
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

LOG_FORMATS = ("text", "json")
LOG_LEVELS = ("debug", "info", "warning", "error")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(tag)s%(message)s"


@dataclass
class RequestLog:
    """What the access line says about one HTTP request, filled in as it is served."""

    request_id: str
    started: float = field(default_factory=time.monotonic)
    model: str | None = None
    first_token: float | None = None
    completion_tokens: int = 0
    prompt_tokens: dict[int, int] = field(default_factory=dict)
    cached_tokens: dict[int, int] = field(default_factory=dict)

    def token(self) -> None:
        """A generation produced output; the first one marks the time to first token."""
        if self.first_token is None:
            self.first_token = time.monotonic()

    def finished(self, prompt_index: int, prompt: int, completion: int, cached: int) -> None:
        """One choice ended; a prompt shared by several choices is counted once."""
        self.prompt_tokens[prompt_index] = prompt
        self.cached_tokens[prompt_index] = cached
        self.completion_tokens += completion

    def fields(self) -> dict[str, Any]:
        """The generation's numbers, for the access line (nothing when nothing ran)."""
        out: dict[str, Any] = {"model": self.model} if self.model else {}
        if self.prompt_tokens:
            out["prompt_tokens"] = sum(self.prompt_tokens.values())
            out["completion_tokens"] = self.completion_tokens
            out["cached_tokens"] = sum(self.cached_tokens.values())
        if self.first_token is not None:
            out["ttft_s"] = round(self.first_token - self.started, 4)
        return out


_CURRENT: ContextVar[RequestLog | None] = ContextVar("mlxcel_request", default=None)


def current_request() -> RequestLog | None:
    """The request being handled in this context, if any."""
    return _CURRENT.get()


@contextmanager
def request_scope(request_id: str) -> Iterator[RequestLog]:
    """Make `request_id` the current request until the block ends."""
    record = RequestLog(request_id)
    token = _CURRENT.set(record)
    try:
        yield record
    finally:
        _CURRENT.reset(token)


class _RequestId(logging.Filter):
    """Gives every record a `request_id`: the one passed in `extra`, else the context's."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "request_id", None) is None:
            current = _CURRENT.get()
            record.request_id = current.request_id if current else None
        return True


# What a text line shows escaped when a client's value carries it: a newline in a `user` field
# would otherwise write a forged line of its own.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def escaped(value: Any) -> Any:
    """A string with its control characters as escapes (\\n, \\x1b); other values as they are."""
    if not isinstance(value, str):
        return value
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode(), value)


class _TextFormatter(logging.Formatter):
    """`time LEVEL logger: [request id] message key=value ...`, the values a line is
    formatted with escaped (the message's own text and a traceback keep their newlines)."""

    def format(self, record: logging.LogRecord) -> str:
        request_id = getattr(record, "request_id", None)
        record = logging.makeLogRecord(record.__dict__)
        if isinstance(record.args, tuple):
            record.args = tuple(escaped(arg) for arg in record.args)
        record.tag = f"[{escaped(request_id)}] " if request_id else ""
        line = super().format(record)
        extra = _extra(record)
        if extra:
            pairs = " ".join(f"{k}={escaped(v)}" for k, v in extra.items())
            first, newline, rest = line.partition("\n")
            line = f"{first} {pairs}{newline}{rest}"
        return line


class _JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, request_id and extra fields."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": self.formatTime(record),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        request_id = getattr(record, "request_id", None)
        if request_id:
            entry["request_id"] = request_id
        entry.update(getattr(record, "http", None) or {})
        entry.update(_extra(record))
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


def _extra(record: logging.LogRecord) -> dict[str, Any]:
    """Structured fields a line carries in `extra={"fields": {...}}` (the access line does)."""
    fields: dict[str, Any] = getattr(record, "fields", None) or {}
    return fields


def configure(level: str, log_format: str) -> None:
    """Send every log line to stderr in `log_format`; uvicorn's own start-up chatter only at
    debug, because the server says itself where it listens."""
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(_RequestId())
    formatter = _JsonFormatter() if log_format == "json" else _TextFormatter(TEXT_FORMAT)
    handler.setFormatter(formatter)
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
    if level.lower() != "debug":
        logging.getLogger("uvicorn.error").setLevel(logging.WARNING)
