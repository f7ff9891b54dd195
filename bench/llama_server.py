"""llama.cpp's own `llama-server`, built once from the llama.cpp inside the llama-cpp-python sdist.

    python bench/llama_server.py [--jobs 2]

The sdist of the llama-cpp-python version installed here is fetched with pip (the package
registry, nothing else), unpacked under bench/.cache, and its vendor/llama.cpp is configured
with cmake for a CPU build and compiled at low priority (`nice -n 19`): the same llama.cpp
version mlxcel runs on. The binary is cached; later calls return it at once.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tarfile
from importlib.metadata import version
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from models import CACHE_DIR

PACKAGE = "llama_cpp_python"


def source_dir(cache: Path, pinned: str) -> Path:
    """The unpacked sdist's llama.cpp sources, fetched from PyPI when not cached."""
    unpacked = cache / f"llama_cpp_python-{pinned}"
    sources = unpacked / "vendor" / "llama.cpp"
    if sources.is_dir():
        return sources
    archive = cache / f"{PACKAGE}-{pinned}.tar.gz"
    if not archive.is_file():
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                # The package from source; its build tools (for pip's metadata step) as wheels.
                "--no-binary",
                "llama-cpp-python",
                f"llama-cpp-python=={pinned}",
                "-d",
                str(cache),
            ],
            check=True,
        )
    with tarfile.open(archive) as tar:
        tar.extractall(cache, filter="data")
    if not sources.is_dir():
        raise RuntimeError(f"{archive} holds no vendor/llama.cpp")
    return sources


def build_llama_server(cache: Path = CACHE_DIR, jobs: int = 2) -> Path:
    """Path of the llama-server binary, built the first time it is asked for."""
    pinned = version("llama-cpp-python")
    build = cache / f"llama-server-{pinned}"
    binary = build / "bin" / "llama-server"
    if binary.is_file():
        return binary
    cache.mkdir(parents=True, exist_ok=True)
    sources = source_dir(cache, pinned)
    nice = ["nice", "-n", "19"]
    subprocess.run(
        [
            *nice,
            "cmake",
            "-S",
            str(sources),
            "-B",
            str(build),
            "-G",
            "Ninja",
            "-DCMAKE_BUILD_TYPE=Release",
            "-DLLAMA_BUILD_SERVER=ON",
            "-DLLAMA_BUILD_TOOLS=ON",
            "-DLLAMA_BUILD_TESTS=OFF",
            "-DLLAMA_BUILD_EXAMPLES=OFF",
            "-DLLAMA_CURL=OFF",
            "-DGGML_NATIVE=ON",
            "-DBUILD_SHARED_LIBS=OFF",
        ],
        check=True,
    )
    subprocess.run(
        [*nice, "cmake", "--build", str(build), "--target", "llama-server", "-j", str(jobs)],
        check=True,
    )
    return binary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cache", type=Path, default=CACHE_DIR)
    parser.add_argument("--jobs", type=int, default=2, help="parallel compile jobs")
    args = parser.parse_args()
    print(build_llama_server(args.cache, args.jobs))


if __name__ == "__main__":
    main()
