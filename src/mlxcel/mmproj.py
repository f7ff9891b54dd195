"""What a projector GGUF (mmproj) encodes, read from its header without loading it: the same
`clip.has_vision_encoder` / `clip.has_audio_encoder` keys libmtmd reads; and any GGUF's
metadata and size, for the Ollama API's model details."""

from __future__ import annotations

import functools
import struct
from pathlib import Path
from typing import BinaryIO

_KEYS = {"clip.has_vision_encoder": "image", "clip.has_audio_encoder": "audio"}
_BOOL, _STRING, _ARRAY = 7, 8, 9
# Bytes of each fixed-size GGUF value type, by its type id.
_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def projector_modalities(path: Path) -> tuple[str, ...]:
    """ "image" and/or "audio", as the projector's header declares; ("image",) for a file that
    cannot be read (the loader says what is wrong with it)."""
    try:
        stat = path.stat()
        return _read(path, stat.st_mtime_ns, stat.st_size) or ("image",)
    except (OSError, ValueError, struct.error):
        return ("image",)


@functools.lru_cache(maxsize=16)
def _read(path: Path, mtime_ns: int, size: int) -> tuple[str, ...]:
    found: dict[str, bool] = {}
    with path.open("rb") as file:
        magic, _version, _tensors, n_kv = struct.unpack("<4sIQQ", file.read(24))
        if magic != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file")
        for _ in range(n_kv):
            key = _string(file)
            kind = _u32(file)
            if key in _KEYS and kind == _BOOL:
                found[_KEYS[key]] = file.read(1) != b"\0"
            else:
                _skip(file, kind)
    return tuple(modality for modality in ("image", "audio") if found.get(modality))


def _u32(file: BinaryIO) -> int:
    value: int = struct.unpack("<I", file.read(4))[0]
    return value


def _string(file: BinaryIO) -> str:
    (length,) = struct.unpack("<Q", file.read(8))
    return file.read(length).decode("utf-8", "replace")


def _skip(file: BinaryIO, kind: int) -> None:
    if kind == _STRING:
        (length,) = struct.unpack("<Q", file.read(8))
        file.seek(length, 1)
    elif kind == _ARRAY:
        item = _u32(file)
        (count,) = struct.unpack("<Q", file.read(8))
        if item in _SIZES:
            file.seek(_SIZES[item] * count, 1)
        else:
            for _ in range(count):
                _skip(file, item)
    elif kind in _SIZES:
        file.seek(_SIZES[kind], 1)
    else:
        raise ValueError(f"unknown GGUF value type {kind}")


_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q"}
_SCALARS.update({11: "<q", 12: "<d"})


def gguf_summary(path: Path) -> tuple[dict[str, object], int]:
    """Any GGUF's scalar metadata (strings and numbers; arrays left out) and its parameter
    count (the tensors' elements), read from the header without loading it."""
    stat = path.stat()
    return _summary(path, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=16)
def _summary(path: Path, mtime_ns: int, size: int) -> tuple[dict[str, object], int]:
    values: dict[str, object] = {}
    with path.open("rb") as file:
        magic, _version, n_tensors, n_kv = struct.unpack("<4sIQQ", file.read(24))
        if magic != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file")
        for _ in range(n_kv):
            key = _string(file)
            kind = _u32(file)
            if kind == _STRING:
                values[key] = _string(file)
            elif kind in _SCALARS:
                fmt = _SCALARS[kind]
                values[key] = struct.unpack(fmt, file.read(struct.calcsize(fmt)))[0]
            else:
                _skip(file, kind)
        parameters = 0
        for _ in range(n_tensors):
            _string(file)
            n_dims = _u32(file)
            dims = struct.unpack(f"<{n_dims}Q", file.read(8 * n_dims))
            file.seek(12, 1)  # the tensor's type and offset
            count = 1
            for dim in dims:
                count *= dim
            parameters += count
    return values, parameters
