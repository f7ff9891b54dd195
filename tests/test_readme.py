"""The README's first screen works as written: its Python examples run, its make line is right."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.server_process import ServerProcess

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
# Where the README's examples expect the server that `make serve` starts.
README_ADDRESS = "127.0.0.1:8080"
PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)
EXAMPLES = PYTHON_BLOCK.findall(README.read_text())


def test_the_readme_has_its_examples() -> None:
    assert len(EXAMPLES) >= 3
    assert any(README_ADDRESS in example for example in EXAMPLES)


@pytest.mark.slow
@pytest.mark.parametrize("example", EXAMPLES, ids=[f"example{i}" for i in range(len(EXAMPLES))])
def test_readme_example_runs(server: ServerProcess, tmp_path: Path, example: str) -> None:
    # As a newcomer runs it: saved to a file, run by the venv's Python in a fresh process.
    script = tmp_path / "example.py"
    script.write_text(example.replace(README_ADDRESS, f"127.0.0.1:{server.port}"))
    result = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=280
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip(), result.stderr


def test_make_serve_passes_port_host_and_args_once() -> None:
    dry_run = subprocess.run(
        ["make", "-n", "serve", "PORT=18250", "HOST=0.0.0.0", "ARGS=-c 512"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    serve = [line for line in dry_run.splitlines() if "mlxcel serve" in line]
    assert len(serve) == 1
    assert serve[0].endswith("mlxcel serve --host 0.0.0.0 --port 18250 -c 512")
    assert "PORT=" in README.read_text() and "HOST=" in README.read_text()
