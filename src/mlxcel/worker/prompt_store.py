"""A text model's prompt cache as its config asks for it (in the model's worker process): the
RAM tier (--cache-ram), the disk tier under it (--cache-disk, --cache-disk-max), llama-server's
slot files (--slot-save-path), and the key that says which saved states this model may load.

The key holds a content hash of the model's files, computed once per file version and kept in
`model-hashes.json` beside the entries (keyed by path, size and modification time), so a
changed file is hashed again and its old states are never offered to it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import secrets
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import mlxcel
from mlxcel.config.settings import ModelConfig
from mlxcel.engine.cache_tiers import CacheTiers
from mlxcel.engine.capabilities import SavesState
from mlxcel.engine.disk_cache import DiskCache, StateKey
from mlxcel.engine.slot_files import SlotFiles
from mlxcel.engine.types import TextGenerator
from mlxcel.progress import progress

logger = logging.getLogger(__name__)

HASHES = "model-hashes.json"
# The package whose version decides each engine's state format.
_ENGINE_PACKAGES = {"llamacpp": "llama_cpp_python", "mlx": "mlx-lm", "transformers": "transformers"}


def _files(path: Path) -> list[Path]:
    """The files whose bytes make a model: the file itself, or a folder's files."""
    if path.is_file():
        return [path]
    return sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith("."))


def _signature(files: list[Path]) -> list[list[Any]]:
    return [[f.name, f.stat().st_size, f.stat().st_mtime_ns] for f in files]


def _file_sha256(path: Path) -> bytes:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while chunk := file.read(1 << 22):
            digest.update(chunk)
    return digest.digest()


def model_hash(paths: list[Path], store: Path) -> str:
    """A SHA-256 of the model's files, read from `store`/model-hashes.json when the files are
    the ones it was computed for (same paths, sizes and times), computed and kept otherwise."""
    files = [f for path in paths for f in _files(path)]
    key = json.dumps([str(p.resolve()) for p in paths])
    signature = _signature(files)
    known: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError):
        known = json.loads((store / HASHES).read_text())
    saved = known.get(key) if isinstance(known, dict) else None
    if isinstance(saved, dict) and saved.get("files") == signature:
        return str(saved["sha256"])
    digest = hashlib.sha256()
    with progress("hashing the model for the prompt cache"):
        for file in files:
            digest.update(file.name.encode() + b"\0")
            digest.update(_file_sha256(file))
    value = digest.hexdigest()
    known = known if isinstance(known, dict) else {}
    known[key] = {"files": signature, "sha256": value}
    temporary = store / f".{HASHES}.{os.getpid()}.{secrets.token_hex(4)}"
    try:
        temporary.write_text(json.dumps(known, indent=1))
        os.replace(temporary, store / HASHES)
    except OSError as exc:
        logger.warning("could not keep the model's hash in %s: %s", store, exc)
        with contextlib.suppress(OSError):
            temporary.unlink()
    return value


def _engine_version(backend: str) -> str:
    package = _ENGINE_PACKAGES.get(backend, backend)
    try:
        engine = version(package)
    except PackageNotFoundError:
        engine = "unknown"
    # mlxcel's own framing of a state (positions, media rows) is part of the format too.
    return f"{backend} {engine}, mlxcel {mlxcel.__version__}"


def state_key(config: ModelConfig, backend: str, n_ctx_seq: int, store: Path) -> StateKey:
    """What this model's saved states are valid for, but their tokens."""
    paths = [config.model, *([config.mmproj] if config.mmproj is not None else [])]
    llama = backend == "llamacpp"
    kv_types = f"{config.cache_type_k}/{config.cache_type_v}" if llama else "model dtype"
    context = f"ctx {config.ctx_size}, per sequence {n_ctx_seq}"
    if llama:
        # Without flash attention llama.cpp keeps V transposed: another state layout.
        context += f", flash_attn {config.flash_attn}"
    return StateKey(model_hash(paths, store), _engine_version(backend), kv_types, context)


def open_prompt_cache(
    config: ModelConfig, backend: str, generator: TextGenerator
) -> tuple[CacheTiers | None, SlotFiles | None]:
    """The prompt cache tiers and slot files the config asks for, where the model's state can
    be saved; (None, None) where it cannot or none is asked for."""
    ram = -1 if config.cache_ram_mib < 0 else config.cache_ram_mib * 1024 * 1024
    wanted = config.cache_ram_mib != 0 or config.cache_disk or config.slot_save_path
    if not wanted:
        return None, None
    if not isinstance(generator, SavesState) or not generator.can_save_state:
        if config.cache_disk or config.slot_save_path:
            logger.warning(
                "[%s] this model's KV state cannot be saved: no disk prompt cache or slot "
                "files; its prompt cache stays in its slots, in memory",
                config.served_name,
            )
        return None, None
    store = config.cache_disk or config.slot_save_path
    if store is None:
        return CacheTiers(ram), None
    store.mkdir(parents=True, exist_ok=True)
    key = state_key(config, backend, generator.n_ctx_seq, store)
    disk = None
    if config.cache_disk is not None:
        disk = DiskCache(config.cache_disk, key, config.cache_disk_max)
        logger.info(
            "[%s] prompt cache on disk: %s (%d states, %.1f MiB of %.0f MiB)",
            config.served_name,
            disk.folder,
            disk.entries,
            disk.total_bytes / 2**20,
            config.cache_disk_max / 2**20,
        )
    slot_files = None
    if config.slot_save_path is not None:
        config.slot_save_path.mkdir(parents=True, exist_ok=True)
        slot_files = SlotFiles(config.slot_save_path, key.digest(), generator.n_ctx_seq)
    return CacheTiers(ram, disk), slot_files
