"""The README's flag table, `--help` and the code's defaults say the same thing."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from tests.server_process import MLXCEL

README = Path(__file__).resolve().parent.parent / "README.md"
ROW = re.compile(r"^\| `(?P<flags>-[^`]+)` \| `(?P<default>[^`]+)` \|", re.MULTILINE)


def _help() -> str:
    result = subprocess.run(
        [MLXCEL, "serve", "--help"],
        capture_output=True,
        text=True,
        check=True,
        # PYTHONPATH kept: the binary must run this checkout's code, not an installed copy's.
        env={
            "COLUMNS": "400",
            "PATH": "/usr/bin:/bin",
            "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
        },
    )
    return result.stdout


def test_readme_defaults_match_help() -> None:
    # argparse puts a long option's description on the next, indented line: join them.
    help_lines = re.sub(r"\n {20,}", " ", _help()).splitlines()
    rows = list(ROW.finditer(README.read_text()))
    assert len(rows) >= 8
    for row in rows:
        long_flag = next(f for f in re.findall(r"--[a-z-]+", row["flags"]))
        line = next(line for line in help_lines if long_flag in line.split())
        assert f"(default: {row['default']})" in line, (long_flag, line)


def test_help_lists_every_readme_flag() -> None:
    help_text = _help()
    for flags in re.findall(r"^\| `(-[^`]+)` \|", README.read_text(), re.MULTILINE):
        for flag in re.findall(r"--?[a-z][a-z-]*", flags):
            assert re.search(rf"(^|[\s,]){re.escape(flag)}([\s,=]|$)", help_text, re.M), flag
