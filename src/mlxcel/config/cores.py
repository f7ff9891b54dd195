"""How many cores this process may use, and how many threads llama.cpp gets by default."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def usable_cores() -> int:
    """The cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


def physical_cores() -> int:
    """The usable cores as llama.cpp counts them for its default threads: the siblings of one
    core (SMT, hyperthreads) count once; on Apple Silicon the performance cores."""
    if sys.platform == "darwin":
        command = ["sysctl", "-n", "hw.perflevel0.physicalcpu"]
        found = subprocess.run(command, capture_output=True, text=True, check=False).stdout
        return int(found) if found.strip().isdigit() else usable_cores()
    try:
        cores = {
            Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list").read_text()
            for cpu in os.sched_getaffinity(0)
        }
    except (AttributeError, OSError):
        return usable_cores()
    return max(1, len(cores))


def default_threads() -> int:
    """Threads for llama.cpp, as llama-server chooses them: the physical cores. The engine's
    threads spin at each barrier of a step, so any other work on the machine (the HTTP side,
    a client) slows a step; with every core theirs, as llama-server's are, the two servers
    compare equal (`python bench/compare.py --threads default`)."""
    return physical_cores()
