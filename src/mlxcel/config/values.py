"""Converters for config file and flag values (sizes, durations, levels): each checks one value
and says what it expected."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from mlxcel.logs import LOG_LEVELS
from mlxcel.memory import total_ram

_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h)?")
_UNITS = {None: 1.0, "ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


Convert = Callable[[Any], Any]


def integer(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"expected an integer, got {value!r}")
    return value


def at_least(minimum: int, maximum: int | None = None) -> Convert:
    def convert(value: Any) -> int:
        number = integer(value)
        if number < minimum or (maximum is not None and number > maximum):
            upper = f" and at most {maximum}" if maximum is not None else ""
            raise ValueError(f"must be at least {minimum}{upper}, got {number}")
        return number

    return convert


def number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"expected a number, got {value!r}")
    return float(value)


def draft_cost(value: Any) -> float | None:
    """--draft-cost: `auto` (None: measured at load) or a share of a decode, at least 0."""
    if value == "auto":
        return None
    try:
        cost = float(value) if isinstance(value, str) else number(value)
    except ValueError:
        raise ValueError(f"expected auto or a number, got {value!r}") from None
    if not 0 <= cost < float("inf"):
        raise ValueError(f"must be auto or at least 0, got {value!r}")
    return cost


def boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"expected true or false, got {value!r}")
    return value


def text(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)) or value == "":
        raise ValueError(f"expected a string, got {value!r}")
    return str(value)


def duration(value: Any) -> float:
    """Seconds from a number or a string like `90`, `30s`, `5m`, `1h`."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    else:
        match = _DURATION.fullmatch(str(value).strip())
        if match is None:
            raise ValueError(f"expected seconds or a duration like 30s, 5m, got {value!r}")
        seconds = float(match.group(1)) * _UNITS[match.group(2)]
    if seconds < 0:
        raise ValueError(f"must not be negative, got {value!r}")
    return seconds


def names(value: Any) -> tuple[str, ...]:
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list):
        raise ValueError(f"expected a list of names, got {value!r}")
    return tuple(text(item).strip() for item in items if str(item).strip())


def choice(options: tuple[str, ...], renamed: dict[str, str] | None = None) -> Convert:
    def convert(value: Any) -> str:
        word = text(value)
        word = (renamed or {}).get(word, word)
        if word not in options:
            raise ValueError(f"expected one of {', '.join(options)}, got {word!r}")
        return word

    return convert


def path(value: Any) -> Path:
    return Path(text(value)).expanduser()


def size(value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return parse_size(text(value))


def template_vars(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"expected a mapping of template variables, got {value!r}")
    return value


def gpu_layers(value: Any) -> int:
    """-ngl's values: a count, or auto / all (-1: every layer)."""
    if value in ("auto", "all"):
        return -1
    return at_least(-1)(value)


SWITCH = ("on", "off", "auto")


def switch(value: Any) -> str:
    """on / off / auto; YAML reads a bare on or off as true or false."""
    if isinstance(value, bool):
        return "on" if value else "off"
    return choice(SWITCH)(value)


# mlx-openai-server's kv_bits (MLX's quantized KV cache) as the llama.cpp cache type of as
# many bits; MLX's other widths (2, 3, 6) have no llama.cpp type.
KV_BITS = {4: "q4_0", 5: "q5_0", 8: "q8_0"}


def kv_bits(value: Any) -> str:
    bits = integer(value)
    if bits not in KV_BITS:
        widths = ", ".join(str(b) for b in KV_BITS)
        raise ValueError(f"llama.cpp has KV cache types of {widths} bits, not {bits}")
    return KV_BITS[bits]


def log_level(value: Any) -> str:
    return choice(LOG_LEVELS)(text(value).lower())


_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b)?", re.IGNORECASE)
_FACTORS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}


def parse_size(text: str) -> int:
    """Bytes from `8G`, `512MiB`, `1073741824` or `50%` (of RAM); ValueError otherwise."""
    value = text.strip()
    if value.endswith("%"):
        try:
            share = float(value[:-1])
        except ValueError:
            raise ValueError(f"'{text}' is not a percentage") from None
        if not 0 < share <= 100:
            raise ValueError(f"'{text}': a percentage of RAM must be above 0 and at most 100")
        return int(total_ram() * share / 100)
    match = _SIZE.fullmatch(value)
    if match is None:
        raise ValueError(f"'{text}' is not a size: use bytes, 512M, 8G or a percentage like 50%")
    size = int(float(match.group(1)) * _FACTORS[match.group(2).lower()])
    if size <= 0:
        raise ValueError(f"'{text}': the size must be above 0")
    return size


# --cors-origins: '*' allows any origin.
ANY_ORIGIN = "*"
_HOST_NAME = re.compile(
    r"^[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*$"
)


def parse_origins(value: str) -> tuple[str, ...]:
    """--cors-origins: `*`, or comma-separated origins like http://localhost:3000 and bare host
    names (`localhost`, `app.example`), which allow that host on http and https, any port."""
    origins = tuple(o.strip().rstrip("/") for o in value.split(",") if o.strip())
    if not origins:
        raise ValueError("--cors-origins needs '*' or at least one origin")
    for origin in origins:
        if origin == ANY_ORIGIN or _HOST_NAME.match(origin):
            continue
        parts = urlsplit(origin)
        if parts.scheme not in ("http", "https") or not parts.netloc or parts.path:
            raise ValueError(
                f"--cors-origins: '{origin}' is not an origin "
                "(scheme://host[:port], a host name, or '*')"
            )
    return origins
