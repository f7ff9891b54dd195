"""Memory: a process's resident set, the machine's RAM, a model's weights on disk, and
--max-memory sizes (bytes, K/M/G suffixes, or a percentage of RAM)."""

from __future__ import annotations

import os
import re
from pathlib import Path

_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b)?", re.IGNORECASE)
_FACTORS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}
MIB = 1024 * 1024


def resident_bytes(pid: int | None = None) -> int | None:
    """A process's resident memory now (this one's by default; None where /proc is not there
    to say, or the process is gone)."""
    try:
        pages = int(Path(f"/proc/{pid or 'self'}/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE")


def total_ram() -> int:
    """The machine's physical memory."""
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def weights_bytes(model: Path) -> int:
    """The size of a model's weights on disk: the GGUF file, or a directory's weight files."""
    if model.is_file():
        return model.stat().st_size
    # A diffusers pipeline keeps its weights in a folder per component.
    files = [*model.rglob("*.safetensors"), *model.rglob("*.gguf")]
    return sum(f.stat().st_size for f in files if f.is_file())


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


def mib(size: int) -> str:
    """A size for a log line or an error message."""
    return f"{size / MIB:.0f} MiB"
