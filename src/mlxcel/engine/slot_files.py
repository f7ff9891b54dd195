"""llama-server's slot files (--slot-save-path): `POST /slots/{id}?action=save|restore|erase`.

A slot's KV state is saved under a name the client gives, in the directory the server was
started with, and restored into a slot later (after a restart too); the restored tokens become
the slot's, so the next request's prefix lookup finds them (which llama-server's own restore
misses: llama.cpp #26676). Files are the disk tier's (`disk_cache.py`), keyed the same way: a
file of another model or settings is refused, not loaded. Each action runs on the engine
thread once its slot is free, as llama-server defers an action on a busy slot.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlxcel.engine.capabilities import SavesState
from mlxcel.engine.disk_cache import BadEntry, decode, encode
from mlxcel.engine.slots import SlotState
from mlxcel.engine.types import EngineError

ACTIONS = ("save", "restore", "erase")
_MAX_NAME = 255


def filename_problem(name: str) -> str | None:
    """Why `name` cannot name a slot file (None: it can): a plain file name only, so that it
    stays inside the directory, as llama.cpp's fs_validate_filename."""
    if not name or len(name.encode()) > _MAX_NAME:
        return "the filename must be 1 to 255 bytes"
    if name in (".", "..") or name.startswith("."):
        return "the filename must not start with a dot"
    if any(c in name for c in "/\\:\0") or any(ord(c) < 32 or ord(c) == 127 for c in name):
        return "the filename must be a plain name: no path separators or control characters"
    return None


def _fails(message: str) -> EngineError:
    return EngineError(message, "invalid_request_error")


@dataclass(frozen=True)
class SlotFiles:
    """Slot actions on files in `directory`, keyed as the disk tier's entries."""

    directory: Path
    key: str
    """The digest of the model's StateKey."""
    n_ctx_seq: int

    def _path(self, filename: str) -> Path:
        problem = filename_problem(filename)
        if problem is not None:
            raise _fails(f"Invalid filename: {problem}")
        return self.directory / filename

    def run(
        self, action: str, slot: int, filename: str, generator: object, state: SlotState
    ) -> dict[str, Any]:
        """Do `action` on slot `slot` (whose tokens are `state`'s); llama-server's answer."""
        assert isinstance(generator, SavesState)
        if action == "erase":
            erased, state.tokens = len(state.tokens), []
            return {"id_slot": slot, "n_erased": erased}
        path = self._path(filename)
        started = time.monotonic()
        if action == "save":
            if not state.tokens:
                raise _fails(f"slot {slot} holds no prompt to save")
            data = encode(self.key, "", state.tokens, generator.save_state(slot))
            temporary = path.with_name(f".{path.name}.tmp")
            try:
                temporary.write_bytes(data)
                temporary.replace(path)
            except OSError as exc:
                raise EngineError(f"Unable to save slot: {exc}", "server_error") from None
            ms = (time.monotonic() - started) * 1e3
            return {
                "id_slot": slot,
                "filename": filename,
                "n_saved": len(state.tokens),
                "n_written": len(data),
                "timings": {"save_ms": round(ms, 3)},
            }
        return self._restore(slot, filename, path, generator, state, started)

    def _restore(
        self,
        slot: int,
        filename: str,
        path: Path,
        generator: SavesState,
        state: SlotState,
        started: float,
    ) -> dict[str, Any]:
        try:
            data = path.read_bytes()
            _, tokens, saved = decode(data, self.key)
        except FileNotFoundError:
            raise _fails(f"Unable to restore slot: no file named {filename}") from None
        except (BadEntry, OSError) as exc:
            raise _fails(f"Unable to restore slot: {filename}: {exc}") from None
        if len(tokens) > self.n_ctx_seq:
            raise _fails("Unable to restore slot: the prompt does not fit the slot's context")
        if not generator.load_state(slot, saved):
            state.tokens = []
            raise _fails("Unable to restore slot: the state does not fit the slot")
        state.tokens = tokens
        ms = (time.monotonic() - started) * 1e3
        return {
            "id_slot": slot,
            "filename": filename,
            "n_restored": len(tokens),
            "n_read": len(data),
            "timings": {"restore_ms": round(ms, 3)},
        }
