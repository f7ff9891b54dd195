"""The docs hold together: the flag table (docs/server-flags.md), `--help` and the code's
defaults say the same thing, and every link between the pages finds its page and heading."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from tests.server_process import MLXCEL

ROOT = Path(__file__).resolve().parent.parent
FLAGS_PAGE = ROOT / "docs" / "server-flags.md"
PAGES = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
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


def test_flag_table_defaults_match_help() -> None:
    # argparse puts a long option's description on the next, indented line: join them.
    help_lines = re.sub(r"\n {20,}", " ", _help()).splitlines()
    rows = list(ROW.finditer(FLAGS_PAGE.read_text()))
    assert len(rows) >= 8
    for row in rows:
        long_flag = next(f for f in re.findall(r"--[a-z-]+", row["flags"]))
        line = next(line for line in help_lines if long_flag in line.split())
        assert f"(default: {row['default']})" in line, (long_flag, line)


def test_help_lists_every_flag_in_the_table() -> None:
    help_text = _help()
    for flags in re.findall(r"^\| `(-[^`]+)` \|", FLAGS_PAGE.read_text(), re.MULTILINE):
        for flag in re.findall(r"--?[a-z][a-z-]*", flags):
            assert re.search(rf"(^|[\s,]){re.escape(flag)}([\s,=]|$)", help_text, re.M), flag


# A Markdown link's target: a page, a page's heading, or both (http(s) and mailto ones aside).
LINK = re.compile(r"\]\((?P<target>[^)\s]+)\)")
HEADING = re.compile(r"^#{1,6} (.+)$", re.MULTILINE)
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def anchors(page: Path) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation dropped, spaces as
    hyphens, and -1, -2, ... after a heading that came before."""
    seen: dict[str, int] = {}
    for heading in HEADING.findall(FENCE.sub("", page.read_text())):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        if count:
            seen[f"{slug}-{count}"] = 1
    return set(seen)


def test_every_link_between_the_pages_lands() -> None:
    broken = []
    for page in PAGES:
        for link in LINK.finditer(FENCE.sub("", page.read_text())):
            target = link["target"]
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            if not linked.exists():
                broken.append(f"{page.name}: {target} (no such file)")
            elif anchor and (linked.suffix != ".md" or anchor not in anchors(linked)):
                broken.append(f"{page.name}: {target} (no such heading)")
    assert not broken, broken


def test_every_page_is_linked_from_the_readme() -> None:
    # The README is the way in: each page of docs/ (and so each section moved there) is one
    # link away from it.
    readme = (ROOT / "README.md").read_text()
    linked = {(ROOT / target.partition("#")[0]).resolve() for target in LINK.findall(readme)}
    assert not [page.name for page in PAGES[1:] if page.resolve() not in linked]
