"""The prompt cache's disk tier (--cache-disk): slot KV states as files, found by token prefix.

A model's entries sit in a folder of their own under the cache directory, named by the digest
of its `StateKey` (what makes a saved state valid besides its tokens), so a state is only ever
offered to the model, engine, KV types and context it came from. One file per entry:

    MAGIC, header length (u32 LE), JSON header, tokens (i32 LE), the backend's state bytes

the header holding the key's digest, the state tag, the token count, the state's length and a
CRC-32 of tokens and state. A file that does not parse, whose checksum fails, or whose key is
another's is skipped with one warning and removed: it is never loaded.

Several servers may share a directory without a lock: each writes to a temporary name of its
own (pid and a random part) and renames it into place, which is atomic, so a reader sees a whole
file or none; an entry's name is the digest of its tag and tokens, so two writers of the same
state write the same file. Least recently used leaves first when the directory is over its
limit, by file time, which a load refreshes: every process sees the same order.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import secrets
import struct
import threading
import time
import zlib
from array import array
from dataclasses import asdict, dataclass
from pathlib import Path

from mlxcel.engine.slots import common_prefix

logger = logging.getLogger(__name__)

MAGIC = b"MLXCELKV"
FORMAT = 1
SUFFIX = ".kvc"
# A temporary file older than this was left by a process that died while writing it.
STALE_TEMP_S = 3600.0
_LENGTH = struct.Struct("<I")


@dataclass(frozen=True)
class StateKey:
    """What a saved KV state is valid for, besides its tokens."""

    model: str
    """A content hash of the model's files (weights, projector)."""
    engine: str
    """The engine and its version, as `llama.cpp 0.3.36`."""
    kv_types: str
    """The KV cache's data types, as `f16/f16`."""
    context: str
    """The settings that change a slot's state: context per sequence, and the like."""
    state_tag: str = ""
    """Anything else a state depends on for the whole model (an adapter set, say)."""

    def digest(self) -> str:
        """The key's name for folders and headers."""
        fields = {**asdict(self), "format": FORMAT}
        text = json.dumps(fields, sort_keys=True).encode()
        return hashlib.sha256(text).hexdigest()[:32]


@dataclass(frozen=True)
class DiskEntry:
    """One entry as indexed: its file, tag, tokens, the state's size and the file's size."""

    path: Path
    tag: str
    tokens: tuple[int, ...]
    state_bytes: int
    file_bytes: int


def entry_name(tag: str, tokens: tuple[int, ...] | list[int]) -> str:
    """The file name of the entry for these tokens under this tag."""
    digest = hashlib.sha256(tag.encode() + b"\0" + array("i", tokens).tobytes())
    return digest.hexdigest()[:40] + SUFFIX


def encode(key: str, tag: str, tokens: list[int] | tuple[int, ...], state: bytes) -> bytes:
    """An entry file's bytes."""
    token_bytes = array("i", tokens).tobytes()
    crc = zlib.crc32(state, zlib.crc32(token_bytes))
    header = {"key": key, "tag": tag, "tokens": len(tokens), "state": len(state), "crc": crc}
    header_bytes = json.dumps(header).encode()
    return b"".join((MAGIC, _LENGTH.pack(len(header_bytes)), header_bytes, token_bytes, state))


class BadEntry(ValueError):
    """A file that is no entry of this key: torn, truncated, foreign or damaged."""


def _header(data: bytes, key: str) -> tuple[dict[str, object], int]:
    """The header of an entry's first bytes and where its tokens start."""
    start = len(MAGIC) + _LENGTH.size
    if len(data) < start or not data.startswith(MAGIC):
        raise BadEntry("not a prompt cache entry")
    (length,) = _LENGTH.unpack_from(data, len(MAGIC))
    try:
        header = json.loads(data[start : start + length])
    except ValueError:
        raise BadEntry("its header is damaged") from None
    if not isinstance(header, dict) or header.get("key") != key:
        raise BadEntry("it belongs to another model or settings")
    for field in ("tokens", "state", "crc"):
        if not isinstance(header.get(field), int) or header[field] < 0:
            raise BadEntry("its header is damaged")
    if not isinstance(header.get("tag"), str):
        raise BadEntry("its header is damaged")
    return header, start + length


def decode(data: bytes, key: str) -> tuple[str, list[int], bytes]:
    """The tag, tokens and state of a whole entry file; BadEntry if it is not one."""
    header, start = _header(data, key)
    n_tokens, n_state = int(header["tokens"]), int(header["state"])  # type: ignore[call-overload]
    end = start + 4 * n_tokens
    if len(data) != end + n_state:
        raise BadEntry("it is truncated" if len(data) < end + n_state else "it is too long")
    token_bytes, state = data[start:end], data[end:]
    if zlib.crc32(state, zlib.crc32(token_bytes)) != header["crc"]:
        raise BadEntry("its checksum does not match")
    return str(header["tag"]), array("i", token_bytes).tolist(), state


def _read_index_entry(path: Path, key: str) -> DiskEntry:
    """An entry's tokens and sizes, from the beginning of its file."""
    with path.open("rb") as file:
        size = os.fstat(file.fileno()).st_size
        head = file.read(len(MAGIC) + _LENGTH.size)
        if len(head) < len(MAGIC) + _LENGTH.size or not head.startswith(MAGIC):
            raise BadEntry("not a prompt cache entry")
        (length,) = _LENGTH.unpack_from(head, len(MAGIC))
        header, start = _header(head + file.read(length), key)
        n_tokens, n_state = int(header["tokens"]), int(header["state"])  # type: ignore[call-overload]
        if size != start + 4 * n_tokens + n_state:
            raise BadEntry(
                "it is truncated" if size < start + 4 * n_tokens + n_state else "too long"
            )
        tokens = array("i")
        tokens.frombytes(file.read(4 * n_tokens))
    return DiskEntry(path, str(header["tag"]), tuple(tokens), n_state, size)


class DiskCache:
    """One model's entries under `root`/<key digest>; `max_bytes` bounds the folder (< 0: no
    bound)."""

    def __init__(self, root: Path, key: StateKey, max_bytes: int) -> None:
        self.key = key
        self._digest = key.digest()
        self.folder = root / self._digest
        self.folder.mkdir(parents=True, exist_ok=True)
        about = self.folder / "key.json"
        if not about.exists():
            with contextlib.suppress(OSError):
                self._write_atomic(about, json.dumps(asdict(key), indent=1).encode())
        self.max_bytes = max_bytes
        # The engine thread looks up and loads while the writer thread writes.
        self._lock = threading.RLock()
        self._index: dict[str, DiskEntry] = {}
        self._seen: dict[str, tuple[int, int]] = {}
        """Each indexed or rejected file's (size, mtime_ns) when it was read."""
        self.hits = 0
        self.writes = 0
        self.load_seconds = 0.0
        self.scan()

    @property
    def entries(self) -> int:
        """Entries indexed (after the last scan)."""
        with self._lock:
            return len(self._index)

    @property
    def total_bytes(self) -> int:
        """Bytes of the entries indexed."""
        with self._lock:
            return sum(entry.file_bytes for entry in self._index.values())

    def scan(self) -> None:
        """Bring the index up to the folder: entries other processes wrote or removed."""
        with self._lock:
            present: dict[str, os.stat_result] = {}
            with contextlib.suppress(FileNotFoundError), os.scandir(self.folder) as found:
                for item in found:
                    if item.name.endswith(SUFFIX) and not item.name.startswith("."):
                        with contextlib.suppress(OSError):
                            present[item.name] = item.stat()
            for name in set(self._index) - set(present):
                del self._index[name]
            for name in set(self._seen) - set(present):
                del self._seen[name]
            for name, stat in present.items():
                if self._seen.get(name, (None, None))[0] == stat.st_size:
                    continue
                self._seen[name] = (stat.st_size, stat.st_mtime_ns)
                try:
                    self._index[name] = _read_index_entry(self.folder / name, self._digest)
                except BadEntry as exc:
                    self._reject(self.folder / name, str(exc))
                except OSError:
                    self._index.pop(name, None)

    def _reject(self, path: Path, why: str) -> None:
        """Skip a file that is no entry of ours, once, and remove it (its name says it is
        ours: a foreign or damaged file there can only mislead)."""
        logger.warning("prompt cache: skipping %s: %s", path, why)
        self._index.pop(path.name, None)
        self._seen.pop(path.name, None)
        with contextlib.suppress(OSError):
            path.unlink()

    def best(self, prompt: list[int], tag: str = "") -> tuple[DiskEntry | None, int]:
        """The entry under `tag` sharing the longest beginning with `prompt`, and its length."""
        with self._lock:
            self.scan()
            found, longest = None, 0
            for entry in self._index.values():
                if entry.tag != tag:
                    continue
                shared = common_prefix(entry.tokens, prompt)
                if shared > longest:
                    found, longest = entry, shared
            return found, longest

    def read(self, entry: DiskEntry) -> bytes | None:
        """An entry's state bytes, checked; None (with a warning) if the file is bad or gone."""
        with self._lock:
            started = time.monotonic()
            try:
                data = entry.path.read_bytes()
                tag, tokens, state = decode(data, self._digest)
            except FileNotFoundError:
                self._index.pop(entry.path.name, None)
                return None
            except (BadEntry, OSError) as exc:
                self._reject(entry.path, str(exc))
                return None
            if tag != entry.tag or tuple(tokens) != entry.tokens:
                self._reject(entry.path, "it changed while it was read")
                return None
            with contextlib.suppress(OSError):
                os.utime(entry.path)  # most recently used, for every process on the folder
            self.hits += 1
            self.load_seconds += time.monotonic() - started
            return state

    def has(self, tokens: list[int] | tuple[int, ...], tag: str = "") -> bool:
        """Whether this state is on disk already."""
        return (self.folder / entry_name(tag, tokens)).exists()

    def put(self, tokens: list[int] | tuple[int, ...], state: bytes, tag: str = "") -> bool:
        """Write an entry (entries it extends go), then keep the folder within its limit;
        False where it was not written (too big, or the disk refused)."""
        with self._lock:
            path = self.folder / entry_name(tag, tokens)
            if path.exists():
                with contextlib.suppress(OSError):
                    os.utime(path)
                return True
            data = encode(self._digest, tag, tokens, state)
            if 0 <= self.max_bytes < len(data):
                return False
            try:
                self._write_atomic(path, data)
            except OSError as exc:
                logger.warning("prompt cache: could not write %s: %s", path, exc)
                return False
            self.writes += 1
            self.scan()
            key = tuple(tokens)
            for entry in list(self._index.values()):
                extended = len(entry.tokens) < len(key) and key[: len(entry.tokens)] == entry.tokens
                if extended and entry.tag == tag:
                    self._remove(entry.path)
            self.trim()
            return True

    def _write_atomic(self, path: Path, data: bytes) -> None:
        temporary = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        try:
            temporary.write_bytes(data)
            os.replace(temporary, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                temporary.unlink()

    def _remove(self, path: Path) -> None:
        self._index.pop(path.name, None)
        self._seen.pop(path.name, None)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()

    def trim(self) -> None:
        """Remove the least recently used entries (by file time) until within the limit, and
        temporary files a dead writer left."""
        with self._lock:
            now = time.time()
            files: list[tuple[float, int, Path]] = []
            with os.scandir(self.folder) as found:
                for item in found:
                    with contextlib.suppress(OSError):
                        stat = item.stat()
                        if item.name.endswith(".tmp") and now - stat.st_mtime > STALE_TEMP_S:
                            os.unlink(item.path)
                        elif item.name.endswith(SUFFIX) and not item.name.startswith("."):
                            files.append((stat.st_mtime, stat.st_size, Path(item.path)))
            total = sum(size for _, size, _ in files)
            for _, size, path in sorted(files, key=lambda f: f[0]):
                if self.max_bytes < 0 or total <= self.max_bytes:
                    break
                self._remove(path)
                total -= size
