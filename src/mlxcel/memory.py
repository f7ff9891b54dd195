"""Memory: a process's resident set, the machine's RAM, a model's weights on disk, and how
much freed memory a worker's heap keeps (the budget itself is the registry's, in models/)."""

from __future__ import annotations

import ctypes
import os
import platform
from pathlib import Path

MIB = 1024 * 1024

# glibc's mallopt parameters.
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4
# Free memory a worker's heap keeps at its top before giving it back to the system.
KEPT_FREE_BYTES = 1024 * MIB


def keep_freed_memory() -> bool:
    """Make this process's allocator (glibc's) reuse large freed blocks instead of returning
    them to the system; False where the C library is not glibc.

    By default glibc serves every allocation over 32 MiB with a fresh mmap that free() unmaps,
    so a model that allocates the same large buffer on each request has the kernel fault in
    and zero every page of it each time: Whisper tiny.en's encoder takes a 54 MB attention
    matrix per layer, 52,700 page faults per clip, and 4 clips (21 s of speech) took 1.82 s
    instead of 1.19 s. A worker process holds one model and ends when it is unloaded, so what
    it keeps is given back then."""
    if platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL(None)
    return bool(libc.mallopt(_M_MMAP_MAX, 0)) and bool(
        libc.mallopt(_M_TRIM_THRESHOLD, KEPT_FREE_BYTES)
    )


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


def mib(size: int) -> str:
    """A size for a log line or an error message."""
    return f"{size / MIB:.0f} MiB"
