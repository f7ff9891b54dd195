"""The models on this machine that mlxcel can serve: the packaged defaults and what the
Hugging Face cache holds (whoever fetched it), listed with kind, size, quantisation and place;
and removing one from the cache, unless a running process has it open."""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from mlxcel.hub.pull import cache_root
from mlxcel.weights import WeightsError, default_embedding_model, default_model_path

# The quantisation a GGUF file's name gives (Q4_K_M, IQ3_XXS, Q8_0, F16, BF16, ...).
_QUANT = re.compile(r"(?<![A-Za-z0-9])(I?Q\d+(?:_[A-Z0-9]+)*|BF16|F16|F32)(?![A-Za-z0-9])", re.I)


@dataclass(frozen=True)
class LocalModel:
    """One model on disk."""

    name: str
    """What `mlxcel serve -m` and `mlxcel rm` take: `ORG/NAME`, `ORG/NAME:FILE.gguf`, or
    `default` for a packaged model."""
    kind: str
    """gguf, folder (MLX or safetensors), or the packaged model's kind."""
    size: int
    quantization: str | None
    path: Path


def quantization(file_name: str) -> str | None:
    """The quantisation in a GGUF file's name, upper case, if it names one."""
    found = _QUANT.findall(Path(file_name).stem)
    return found[-1].upper() if found else None


def _packaged() -> list[LocalModel]:
    models = []
    for name, kind, find in (
        ("default", "gguf", default_model_path),
        ("default (embedding)", "folder", default_embedding_model),
    ):
        try:
            path = find()
        except WeightsError:
            continue
        size = path.stat().st_size if path.is_file() else _folder_size(path)
        models.append(LocalModel(name, kind, size, quantization(path.name), path))
    return models


def _folder_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def cached(cache_dir: Path | None = None) -> list[LocalModel]:
    """The model repos of the Hugging Face cache that mlxcel can serve: each GGUF file, and
    each folder with a config.json."""
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    try:
        info = scan_cache_dir(cache_root(cache_dir))
    except CacheNotFound:
        return []
    models = []
    for repo in sorted(info.repos, key=lambda r: r.repo_id):
        if repo.repo_type != "model" or not repo.revisions:
            continue
        revision = max(repo.revisions, key=lambda r: r.last_modified)
        files = {f.file_name: f for f in revision.files}
        for name, file in sorted(files.items()):
            if name.lower().endswith(".gguf") and "mmproj" not in name.lower():
                models.append(
                    LocalModel(
                        f"{repo.repo_id}:{name}",
                        "gguf",
                        file.size_on_disk,
                        quantization(name),
                        file.file_path,
                    )
                )
        if "config.json" in files or "model_index.json" in files:
            models.append(
                LocalModel(
                    repo.repo_id, "folder", revision.size_on_disk, None, revision.snapshot_path
                )
            )
    return models


def local_models(cache_dir: Path | None = None) -> list[LocalModel]:
    """Every model on disk mlxcel can serve: the packaged ones, then the cache's."""
    return _packaged() + cached(cache_dir)


class RemoveError(Exception):
    """A model that cannot be removed; the message says why."""


def _repo_folder(repo: str, cache_dir: Path | None) -> Path:
    return cache_root(cache_dir) / f"models--{repo.replace('/', '--')}"


def held_by(paths: set[Path]) -> list[int]:
    """Processes that have any of `paths` open or mapped (Linux /proc; elsewhere none known)."""
    proc = Path("/proc")
    holders = []
    wanted = {str(p) for p in paths}
    for entry in proc.iterdir() if proc.is_dir() else ():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            maps = (entry / "maps").read_text(errors="replace")
            opened = {os.readlink(fd) for fd in (entry / "fd").iterdir()}
        except OSError:
            continue
        mapped = {line.split(maxsplit=5)[-1] for line in maps.splitlines() if "/" in line}
        if wanted & (mapped | opened):
            holders.append(int(entry.name))
    return holders


def remove(name: str, cache_dir: Path | None = None) -> list[Path]:
    """Remove a model of the cache (`ORG/NAME`: the whole repo; `ORG/NAME:FILE`: that file);
    the paths removed. RemoveError for an unknown name, or one a running process holds."""
    repo, _, file_name = name.partition(":")
    folder = _repo_folder(repo, cache_dir)
    if not folder.is_dir():
        raise RemoveError(f"'{name}' is not in the Hugging Face cache at {cache_root(cache_dir)}")
    if file_name:
        links = [p for p in (folder / "snapshots").glob(f"*/{file_name}") if p.is_symlink()]
        if not links:
            raise RemoveError(f"{repo} in the cache has no file '{file_name}'")
        blobs = {link.resolve() for link in links}
        targets = set(links) | blobs
    else:
        blobs = {p.resolve() for p in folder.rglob("*") if p.is_file()}
        targets = {folder}
    pids = held_by(blobs)
    if pids:
        raise RemoveError(
            f"'{name}' is in use by process {', '.join(map(str, pids))} (a server serving "
            "it?): stop or unload it first"
        )
    for target in targets:
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        else:
            target.unlink(missing_ok=True)
    return sorted(targets)
