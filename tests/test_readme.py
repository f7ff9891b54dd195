"""The docs work as written: every Python example in README.md and docs/*.md runs, and the
README's make line is right."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import serving
from tests.server_process import ServerProcess

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = (README, *sorted((ROOT / "docs").glob("*.md")))
# Where the examples expect the server that `make serve` starts.
README_ADDRESS = "127.0.0.1:8080"
PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)
# An example that needs a model the default server lacks says so on the line before it, as
# `<!-- needs: embedding -->` (kinds separated by spaces); it runs against a server that has them.
NEEDS_COMMENT = re.compile(r"<!-- needs: ([a-z ]+) -->")
# The flags that serve each kind a `needs` comment may name, beside the default chat model.
NEEDS_FLAGS: dict[str, tuple[str, ...]] = {
    "embedding": ("--embedding-model", "default"),
    "speech": ("--speech-model", "default"),
    "transcription": ("--transcription-model", "default"),
}


@dataclass(frozen=True)
class Example:
    """One ```python block of a page, and the model kinds its server must have."""

    page: Path
    line: int
    code: str
    needs: tuple[str, ...]

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def examples(page: Path) -> list[Example]:
    text = page.read_text()
    found = []
    for block in PYTHON_BLOCK.finditer(text):
        before = text[: block.start()].rstrip("\n").rpartition("\n")[2]
        needs = NEEDS_COMMENT.fullmatch(before)
        found.append(
            Example(
                page=page,
                line=text.count("\n", 0, block.start()) + 1,
                code=block[1],
                needs=tuple(needs[1].split()) if needs else (),
            )
        )
    return found


EXAMPLES = [example for page in PAGES for example in examples(page)]


def test_the_readme_has_its_examples() -> None:
    readme = [example.code for example in EXAMPLES if example.page == README]
    assert len(readme) >= 3
    assert any(README_ADDRESS in code for code in readme)


def test_every_needs_comment_is_read() -> None:
    # A comment the pattern misses (a typo, an unknown kind) would leave its example on the
    # default server, where it fails for the wrong reason; say so here instead.
    for page in PAGES:
        for line in page.read_text().splitlines():
            if line.startswith("<!--") and "need" in line:
                kinds = NEEDS_COMMENT.fullmatch(line)
                assert kinds, (page.name, line)
                assert set(kinds[1].split()) <= NEEDS_FLAGS.keys(), (page.name, line)
    needed = {example.name for example in EXAMPLES if example.needs}
    assert needed, "the docs have no example that needs a side model: is NEEDS_COMMENT read?"


@pytest.fixture(scope="module")
def side_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The default model with every side model the examples' `needs` comments name."""
    kinds = sorted({kind for example in EXAMPLES for kind in example.needs})
    yield from serving(tmp_path_factory, "docs", *(f for k in kinds for f in NEEDS_FLAGS[k]))


@pytest.mark.slow
@pytest.mark.parametrize("example", EXAMPLES, ids=[example.name for example in EXAMPLES])
def test_example_runs(request: pytest.FixtureRequest, tmp_path: Path, example: Example) -> None:
    server: ServerProcess = request.getfixturevalue("side_server" if example.needs else "server")
    # As a newcomer runs it: saved to a file, run by the venv's Python in a fresh process.
    script = tmp_path / "example.py"
    script.write_text(example.code.replace(README_ADDRESS, f"127.0.0.1:{server.port}"))
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
