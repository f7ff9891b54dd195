"""Getting a model from the Hugging Face Hub: which files a pull takes, the room they need,
and the download itself, with progress and a way to cancel.

The files go into the standard Hugging Face cache's layout (every other tool sees them) or a
folder of the user's choosing, through huggingface_hub's download of one file: a connection cut
mid-file is resumed within the pull, and an interrupted file stays as its `.part`, which the
next pull continues; a file is in place only once whole, so a cut never leaves a model that
loads broken.
"""

from __future__ import annotations

import fnmatch
import os
import re
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlxcel.weights import HUB_PATTERNS

_REPO = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")
# A split GGUF's parts: name-00001-of-00003.gguf.
_PART = re.compile(r"-\d{5}-of-\d{5}\.gguf$", re.IGNORECASE)


class PullError(Exception):
    """A pull that cannot start or did not finish; the message is one line saying why."""


class PullCancelled(PullError):
    """The pull was cancelled; what it fetched stays, to be resumed."""


@dataclass(frozen=True)
class PullSpec:
    """`REPO[:FILE_OR_QUANT]`: a repo, and for a GGUF repo which file of it."""

    repo: str
    selector: str | None = None

    @classmethod
    def parse(cls, text: str) -> PullSpec:
        repo, _, selector = text.strip().partition(":")
        if not _REPO.fullmatch(repo):
            raise PullError(
                f"'{text}' is not a Hugging Face repo: give ORG/NAME, or ORG/NAME:Q4_K_M or "
                "ORG/NAME:FILE.gguf for one file of a GGUF repo"
            )
        return cls(repo, selector or None)

    def __str__(self) -> str:
        return self.repo if self.selector is None else f"{self.repo}:{self.selector}"


@dataclass(frozen=True)
class RemoteFile:
    """A file of the repo the pull takes, and its size in bytes."""

    name: str
    size: int


def _hub_error(repo: str, exc: Exception) -> PullError:
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    if isinstance(exc, GatedRepoError):
        return PullError(
            f"{repo} is gated: accept its terms on the Hub and log in (hf auth login, or HF_TOKEN)"
        )
    if isinstance(exc, RepositoryNotFoundError):
        return PullError(f"{repo}: no such model on the Hugging Face Hub (or it needs a token)")
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return PullError(f"could not reach the Hugging Face Hub for {repo}: {first}")


def plan(spec: PullSpec) -> list[RemoteFile]:
    """The files `spec` means, with their sizes, from the Hub's listing of the repo."""
    from huggingface_hub import HfApi, constants

    if constants.HF_HUB_OFFLINE:
        raise PullError(f"HF_HUB_OFFLINE is set: {spec} cannot be downloaded (unset it to pull)")
    try:
        info = HfApi().model_info(spec.repo, files_metadata=True)
    except Exception as exc:
        raise _hub_error(spec.repo, exc) from None
    files = [RemoteFile(s.rfilename, s.size or 0) for s in info.siblings or ()]
    return choose(spec, files)


def choose(spec: PullSpec, files: list[RemoteFile]) -> list[RemoteFile]:
    """What a pull of `spec` takes from a repo holding `files`."""
    ggufs = [f for f in files if f.name.lower().endswith(".gguf")]
    if spec.selector is not None:
        chosen = [f for f in files if spec.selector in (f.name, f.name.rsplit("/", 1)[-1])]
        if not chosen:
            wanted = spec.selector.lower()
            chosen = [
                f for f in ggufs if wanted in f.name.lower() and "mmproj" not in f.name.lower()
            ]
        if not chosen:
            raise PullError(
                f"{spec.repo} has no file or quantisation '{spec.selector}'; it has: "
                + (", ".join(f.name for f in ggufs) or ", ".join(f.name for f in files))
            )
        named = {f.name for f in chosen}
        if len({_PART.sub("", name) for name in named}) > 1:
            raise PullError(
                f"'{spec.selector}' matches several files of {spec.repo} "
                f"({', '.join(sorted(named))}): give the file name"
            )
        return chosen
    weights = [f for f in files if f.name.endswith(".safetensors")]
    if ggufs and not weights:
        models = [f for f in ggufs if "mmproj" not in f.name.lower()]
        if len({_PART.sub("", f.name) for f in models}) == 1:
            return models
        raise PullError(
            f"{spec.repo} holds several GGUF files: choose one, as {spec.repo}:Q4_K_M or "
            f"{spec.repo}:FILE.gguf ({', '.join(f.name for f in models)})"
        )
    if any(f.name == "model_index.json" for f in files):
        return files  # a diffusers pipeline: each component in a folder of its own
    if not any(f.name == "config.json" for f in files):
        raise PullError(f"{spec.repo} is neither a GGUF repo nor a model folder (no config.json)")
    return [f for f in files if any(fnmatch.fnmatch(f.name, p) for p in HUB_PATTERNS)]


@dataclass
class Progress:
    """How far a pull is: bytes done of the total, the rate over the last seconds, and the
    time left at that rate."""

    total: int
    done: int = 0
    rate: float = 0.0
    file: str = ""

    @property
    def eta_s(self) -> float | None:
        """Seconds left at the current rate (None before there is one)."""
        return (self.total - self.done) / self.rate if self.rate > 0 else None


class Tracker:
    """Counts a pull's bytes as huggingface_hub's progress bars report them, and cancels it
    at the next chunk once asked."""

    def __init__(self, total: int, report: Callable[[Progress], None] | None) -> None:
        self.progress = Progress(total)
        self._report = report
        self._cancelled = threading.Event()
        self._window: list[tuple[float, int]] = []

    def cancel(self) -> None:
        """Stop at the next chunk (what was fetched stays, to be resumed)."""
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def add(self, n: int) -> None:
        if self._cancelled.is_set():
            raise PullCancelled("the pull was cancelled")
        now = time.monotonic()
        self.progress.done += n
        self._window.append((now, self.progress.done))
        while len(self._window) > 2 and now - self._window[0][0] > 5.0:
            self._window.pop(0)
        first_time, first_done = self._window[0]
        if now > first_time:
            self.progress.rate = (self.progress.done - first_done) / (now - first_time)
        if self._report is not None:
            self._report(self.progress)

    def bar_class(self) -> type:
        """A tqdm class for huggingface_hub's downloads that reports here and draws nothing."""
        from huggingface_hub.utils import tqdm

        tracker = self

        class Counted(tqdm):  # type: ignore[misc]
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                kwargs["disable"] = True
                super().__init__(*args, **kwargs)
                # A resumed file starts where its part ended.
                tracker.add(int(kwargs.get("initial") or 0))

            def update(self, n: float | None = 1) -> bool | None:
                tracker.add(int(n or 0))
                return None

        return Counted


def _existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_room(files: list[RemoteFile], target: Path) -> None:
    """PullError unless the disk under `target` has room for `files` (what a earlier pull
    left of them is not counted twice: it is only a part)."""
    need = sum(f.size for f in files)
    free = shutil.disk_usage(_existing(target)).free
    if need > free:
        raise PullError(
            f"not enough free disk space: the pull needs {need / 2**20:.0f} MiB and "
            f"{_existing(target)} has {free / 2**20:.0f} MiB free"
        )


def cache_root(cache_dir: Path | None) -> Path:
    """Where pulls go: `cache_dir`, else the Hugging Face cache (HF_HUB_CACHE, HF_HOME)."""
    from huggingface_hub import constants

    return cache_dir if cache_dir is not None else Path(constants.HF_HUB_CACHE)


def _fetch(
    repo: str, name: str, tracker: Tracker, cache_dir: Path | None, local_dir: Path | None
) -> Path:
    """One file into the Hugging Face cache's layout (blob, snapshot link, ref) or `local_dir`.

    huggingface_hub resumes a cut connection within one download but drops its partial file
    when the process ends; here the part is kept under a name of its own, beside where the
    file goes, and the next pull continues it with a ranged request."""
    from huggingface_hub import constants
    from huggingface_hub.file_download import (
        get_hf_file_metadata,
        hf_hub_url,
        http_get,
        repo_folder_name,
    )
    from huggingface_hub.utils import build_hf_headers

    meta = get_hf_file_metadata(hf_hub_url(repo, name))
    if meta.commit_hash is None or meta.etag is None:
        raise PullError(f"the Hub did not say which version of {repo}/{name} it serves")
    if local_dir is not None:
        target = local_dir / name
    else:
        folder = cache_root(cache_dir) / repo_folder_name(repo_id=repo, repo_type="model")
        target = folder / "blobs" / meta.etag
    part = target.with_name(target.name + ".part")
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        have = part.stat().st_size if part.exists() else 0
        if meta.size is not None and have > meta.size:
            have = 0  # not a part of this file
        with part.open("ab" if have else "wb") as out:
            http_get(
                meta.location,
                out,
                resume_size=have,
                headers=build_hf_headers(),
                expected_size=meta.size,
                tqdm_class=tracker.bar_class(),
            )
        if meta.size is not None and part.stat().st_size != meta.size:
            raise PullError(f"{name} arrived with {part.stat().st_size} of {meta.size} bytes")
        part.replace(target)
    if local_dir is not None:
        return target
    link = folder / "snapshots" / meta.commit_hash / name
    link.parent.mkdir(parents=True, exist_ok=True)
    if not link.exists():
        link.unlink(missing_ok=True)
        link.symlink_to(os.path.relpath(target, link.parent))
    (folder / "refs").mkdir(exist_ok=True)
    (folder / "refs" / constants.DEFAULT_REVISION).write_text(meta.commit_hash)
    return link


def pull(
    spec: PullSpec,
    files: list[RemoteFile],
    tracker: Tracker,
    cache_dir: Path | None = None,
    local_dir: Path | None = None,
) -> Path:
    """Download `files` of the repo; the GGUF file (its first part) or the model folder."""
    check_room(files, local_dir or cache_root(cache_dir))
    paths: list[Path] = []
    for remote in files:
        tracker.progress.file = remote.name
        try:
            paths.append(_fetch(spec.repo, remote.name, tracker, cache_dir, local_dir))
        except PullError:
            raise
        except OSError as exc:
            raise PullError(f"could not write {remote.name}: {exc}") from None
        except Exception as exc:
            raise _hub_error(spec.repo, exc) from None
    ggufs = sorted(p for p in paths if p.name.lower().endswith(".gguf"))
    if ggufs and all(p.name.lower().endswith(".gguf") for p in paths):
        return ggufs[0]
    # The folder that holds config.json: the snapshot (or local_dir).
    top = next(p for p in paths if p.name in ("config.json", "model_index.json"))
    return top.parent
