"""llama.cpp's own `llama-server`, built once against the llama.cpp that mlxcel runs.

    python bench/llama_server.py [--cache DIR] [--jobs 2]

The sdist of the installed llama-cpp-python version is fetched with pip (the package registry,
nothing else) into a cache outside the repository (MLXCEL_BENCH_CACHE, else
~/.cache/mlxcel-bench), and its vendor/llama.cpp is configured with cmake. Only the server's
own code (tools/server, common, the HTTP and hash vendors) is compiled; the binary links the
libllama, libmtmd and libggml shared libraries of the installed llama-cpp-python wheel, so
llama-server and mlxcel run the very same engine code, and the build takes a fraction of a
full llama.cpp build. The binary is cached; later calls return it at once.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path

import llama_cpp

CACHE_DIR = Path(os.environ.get("MLXCEL_BENCH_CACHE", Path.home() / ".cache" / "mlxcel-bench"))
# The static libraries of the server's own code, archived here; the engine's come from the wheel.
SERVER_LIBRARIES = (
    "tools/server/libllama-server-impl.a",
    "tools/server/libserver-context.a",
    "common/libllama-common.a",
    "common/libllama-common-base.a",
    "vendor/hash/libvendor-hash.a",
    "tools/ui/libllama-ui.a",
    "vendor/cpp-httplib/libcpp-httplib.a",
)
MAIN_OBJECT = "tools/server/CMakeFiles/llama-server.dir/main.cpp.o"
BINARY = "bin/llama-server"
# The engine's static libraries in llama-server's link line, and the wheel's shared ones.
ENGINE_LIBRARIES = {
    "tools/mtmd/libmtmd.a": "libmtmd.so",
    "src/libllama.a": "libllama.so",
    "ggml/src/libggml.a": "libggml.so",
    "ggml/src/libggml-cpu.a": "libggml-cpu.so",
    "ggml/src/libggml-base.a": "libggml-base.so",
}


def wheel_libraries() -> Path:
    """The folder of the installed llama-cpp-python's shared libraries."""
    return Path(llama_cpp.__file__).resolve().parent / "lib"


def tool(name: str) -> str:
    """A build tool from this environment (the bench extra installs cmake and ninja), else
    from PATH."""
    here = Path(sys.executable).parent / name
    found = str(here) if here.is_file() else shutil.which(name)
    if found is None:
        raise RuntimeError(f"{name} is needed to build llama-server: pip install {name}")
    return found


def sdist_archive(cache: Path, project: str, pinned: str) -> Path:
    """The sdist of `project` (a PyPI name) in `cache`, fetched when not cached."""
    archive = cache / f"{project.replace('-', '_')}-{pinned}.tar.gz"
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
                project,
                f"{project}=={pinned}",
                "-d",
                str(cache),
            ],
            check=True,
        )
    return archive


def unpack_sdist(cache: Path, project: str, pinned: str, inside: str) -> Path:
    """`inside` the unpacked sdist of `project` (a PyPI name), fetched when not cached."""
    sources = cache / f"{project.replace('-', '_')}-{pinned}" / inside
    if sources.exists():
        return sources
    archive = sdist_archive(cache, project, pinned)
    with tarfile.open(archive) as tar:
        tar.extractall(cache, filter="data")
    if not sources.exists():
        raise RuntimeError(f"{archive} holds no {inside}")
    return sources


def source_dir(cache: Path, pinned: str) -> Path:
    """The unpacked sdist's llama.cpp sources, fetched from PyPI when not cached."""
    return unpack_sdist(cache, "llama-cpp-python", pinned, "vendor/llama.cpp")


def _configure(sources: Path, build: Path) -> None:
    if (build / "build.ninja").is_file():
        return
    subprocess.run(
        [
            tool("cmake"),
            "-S",
            str(sources),
            "-B",
            str(build),
            "-G",
            "Ninja",
            f"-DCMAKE_MAKE_PROGRAM={tool('ninja')}",
            "-DCMAKE_BUILD_TYPE=Release",
            "-DLLAMA_BUILD_SERVER=ON",
            "-DLLAMA_BUILD_TOOLS=ON",
            "-DLLAMA_BUILD_TESTS=OFF",
            "-DLLAMA_BUILD_EXAMPLES=OFF",
            "-DLLAMA_CURL=OFF",
            "-DBUILD_SHARED_LIBS=OFF",
        ],
        check=True,
    )


def _ninja(build: Path, *args: str) -> str:
    done = subprocess.run(
        [tool("ninja"), "-C", str(build), *args], check=True, capture_output=True, text=True
    )
    return done.stdout


def _last_command(build: Path, target: str) -> str:
    """The command ninja runs to make `target` itself (not its inputs)."""
    return _ninja(build, "-t", "commands", target).strip().splitlines()[-1]


def _objects(build: Path, library: str) -> list[str]:
    """The object files a static library of the build archives."""
    rules = (build / "build.ninja").read_text()
    rule = re.search(rf"^build {re.escape(library)}: (.*)$", rules, re.M)
    if rule is None:
        raise RuntimeError(f"{library} is not in {build}/build.ninja")
    explicit = rule.group(1).split("||")[0].split()[1:]
    return [path for path in explicit if path.endswith(".o")]


def _link_command(build: Path) -> str:
    """llama-server's link line with the wheel's shared engine libraries."""
    command = _last_command(build, BINARY)
    libraries = wheel_libraries()
    for static, shared in ENGINE_LIBRARIES.items():
        if f" {static} " not in f" {command} ":
            raise RuntimeError(f"llama-server's link line has no {static}: {command}")
        command = command.replace(f" {static} ", f" {libraries / shared} ")
    return command.replace(" -o ", f" -Wl,-rpath,{libraries} -o ", 1)


def build_llama_server(cache: Path = CACHE_DIR, jobs: int = 2) -> Path:
    """Path of the llama-server binary, built the first time it is asked for."""
    pinned = version("llama-cpp-python")
    build = cache / f"llama-server-{pinned}"
    binary = build / BINARY
    if binary.is_file():
        return binary
    cache.mkdir(parents=True, exist_ok=True)
    _configure(source_dir(cache, pinned), build)
    objects = [MAIN_OBJECT] + [o for lib in SERVER_LIBRARIES for o in _objects(build, lib)]
    # The objects only: asking for the libraries would make ninja build the engine too.
    subprocess.run([tool("ninja"), "-C", str(build), "-j", str(jobs), *objects], check=True)
    for library in SERVER_LIBRARIES:
        (build / library).unlink(missing_ok=True)
        subprocess.run(_last_command(build, library), shell=True, cwd=build, check=True)
    subprocess.run(_link_command(build), shell=True, cwd=build, check=True)
    return binary


def build_command(description: str, build: Callable[[Path, int], Path]) -> None:
    """A build script's command line: --cache and --jobs; prints what it built and the time."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--cache", type=Path, default=CACHE_DIR)
    parser.add_argument("--jobs", type=int, default=2, help="parallel compile jobs")
    args = parser.parse_args()
    started = time.perf_counter()
    built = build(args.cache, args.jobs)
    print(f"{built} ({time.perf_counter() - started:.0f} s)")


def main() -> None:
    build_command(__doc__.split("\n")[0], build_llama_server)


if __name__ == "__main__":
    main()
