"""stable-diffusion-cpp-python, built once from its sdist for the CPU, for the benchmark only.

    python bench/sdcpp_build.py [--cache DIR] [--jobs 2]

The sdist of the pinned version is fetched with pip (the package registry, nothing else) into
a cache outside the repository (MLXCEL_BENCH_CACHE, else ~/.cache/mlxcel-bench), its vendored
stable-diffusion.cpp is configured with cmake for ggml's CPU backend (every GPU backend off,
WebP/WebM output off: the bindings hand back raw pixels) and only the `stable-diffusion`
shared library is compiled. The package's Python sources and that library are copied into
a folder of their own that bench/sdcpp.py puts on sys.path: nothing enters the venv, and
nothing is built at test time. Later calls return the folder at once. The build took 456 s of
CPU (35 minutes under `nice -n 10` on 2 cores shared with other work); PyPI has no wheels.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llama_server import CACHE_DIR, build_command, tool, unpack_sdist

PROJECT = "stable-diffusion-cpp-python"
PINNED = "0.4.7"


def build_sdcpp(cache: Path = CACHE_DIR, jobs: int = 2) -> Path:
    """The folder to put on sys.path for `import stable_diffusion_cpp`, built if missing."""
    target = cache / f"sdcpp-{PINNED}-cpu"
    if (target / "stable_diffusion_cpp" / "lib" / "libstable-diffusion.so").is_file():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    vendored = unpack_sdist(cache, PROJECT, PINNED, "vendor/stable-diffusion.cpp")
    build = cache / f"sdcpp-{PINNED}-build"
    if not (build / "build.ninja").is_file():
        subprocess.run(
            [
                tool("cmake"),
                "-S",
                str(vendored),
                "-B",
                str(build),
                "-G",
                "Ninja",
                f"-DCMAKE_MAKE_PROGRAM={tool('ninja')}",
                "-DCMAKE_BUILD_TYPE=Release",
                "-DSD_BUILD_SHARED_LIBS=ON",
                "-DSD_BUILD_EXAMPLES=OFF",
                "-DSD_WEBP=OFF",
                "-DSD_WEBM=OFF",
                "-DGGML_NATIVE=ON",
            ],
            check=True,
        )
    subprocess.run(
        [tool("ninja"), "-C", str(build), "-j", str(jobs), "stable-diffusion"], check=True
    )
    built = next(build.rglob("libstable-diffusion.so"))
    package = target / "stable_diffusion_cpp"
    shutil.copytree(vendored.parent.parent / "stable_diffusion_cpp", package, dirs_exist_ok=True)
    (package / "lib").mkdir(exist_ok=True)
    shutil.copy2(built, package / "lib" / built.name)
    return target


def main() -> None:
    build_command(__doc__.split("\n")[0], build_sdcpp)


if __name__ == "__main__":
    main()
