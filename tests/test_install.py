"""The README's install commands work as written: `make wheel` builds the wheel, and the wheel
installs the server into an environment of its own and the client into a project's.

They run offline. A user's pip downloads the dependencies; here every package of the test venv
stands in for them, mlxcel's own excepted: each new environment sees a folder of links to the
test venv's installed packages through a .pth, and pip runs with no index and no config. So pip
still checks that the wheel's requirements (the `server` extra's included) are met, by the very
versions the test suite runs on, and mlxcel itself can come only from the wheel. What this does
not check is that PyPI serves those versions: `make serve` and `make test` install from it.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import httpx
import pytest

from tests.server_process import free_port

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
SECTION = "## Install from a wheel"
SHELL_BLOCK = re.compile(r"^```sh\n(.*?)^```", re.MULTILINE | re.DOTALL)
PYPROJECT = (ROOT / "pyproject.toml").read_text()
VERSION = re.search(r'^version = "([^"]+)"$', PYPROJECT, re.MULTILINE)[1]
# The extras a user may ask for: all but the project's own tools.
EXTRAS = set(
    re.findall(
        r"^([a-z-]+) = \[$",
        PYPROJECT.split("[project.optional-dependencies]")[1].split("\n[")[0],
        re.MULTILINE,
    )
) - {"dev", "bench"}
WHEEL = f"dist/mlxcel-{VERSION}-py3-none-any.whl"
# Seconds for the installed server to answer /health (its first start compiles nothing, but
# imports the server and loads the default model in a worker on a busy machine).
READY_S = 120


def install_blocks() -> tuple[list[str], list[str]]:
    """The README's two blocks of install commands: the server's, then the client's."""
    section = README.read_text().split(SECTION + "\n", 1)[1].split("\n## ", 1)[0]
    server, client = (
        [line.split("  #", 1)[0].strip() for line in block.splitlines()]
        for block in SHELL_BLOCK.findall(section)
    )
    return server, client


def stand_in_dependencies(folder: Path) -> Path:
    """A folder of links to every entry of the test venv's site-packages but mlxcel's own (its
    dist-info and the editable install's finder and .pth)."""
    site = Path(sysconfig.get_paths()["purelib"])
    folder.mkdir()
    for entry in site.iterdir():
        if "mlxcel" not in entry.name.lower():
            (folder / entry.name).symlink_to(entry)
    return folder


def see_dependencies(venv: Path, deps: Path) -> None:
    """Make `deps` a site folder of a new venv (its .pth files run too), after its own."""
    (site,) = venv.glob("lib/python*/site-packages")
    (site / "test-venv-dependencies.pth").write_text(
        f"import site; site.addsitedir({str(deps)!r})\n"
    )


def run(command: str, cwd: Path, env: dict[str, str]) -> str:
    result = subprocess.run(
        command, shell=True, cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, (command, result.stdout[-3000:], result.stderr[-3000:])
    return result.stdout


def offline_env(home: Path, path: str) -> dict[str, str]:
    """A shell's environment for a user's commands: HOME is the scratch folder (`~/.mlxcel`
    lands there), pip has no index, no config file and no find-links, and no PYTHONPATH leads
    back to this checkout."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("PIP_") and key not in {"PYTHONPATH", "VIRTUAL_ENV"}
    }
    return {
        **env,
        "HOME": str(home),
        "PATH": path,
        "PIP_NO_INDEX": "1",
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }


def site_of(python: Path, env: dict[str, str]) -> Path:
    """The folder a venv's Python imports mlxcel from."""
    out = run(f"{python} -c 'import mlxcel; print(mlxcel.__file__)'", python.parent, env)
    return Path(out.strip()).parent.parent


def test_the_readme_installs_the_wheel_make_builds() -> None:
    server, client = install_blocks()
    assert server[0] == "make wheel" and WHEEL in server[2] and WHEEL in client[0]
    # The extras it lists beside `server` are the wheel's, every one.
    section = " ".join(README.read_text().split(SECTION, 1)[1].split())
    listed = section.split("named in the same brackets", 1)[1].split("(pyproject.toml", 1)[0]
    assert set(re.findall(r"`([a-z-]+)`", listed)) == EXTRAS - {"server"}


@pytest.mark.slow
def test_install_commands_run_offline(tmp_path: Path) -> None:
    server_commands, client_commands = install_blocks()
    # This checkout as a fresh clone has it (its tracked and unignored files), with the test
    # venv as its .venv: `make wheel` writes build/ and dist/ there, not in the checkout.
    checkout = tmp_path / "checkout"
    files = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for name in filter(None, (f.decode() for f in files)):
        if (ROOT / name).is_file():
            (checkout / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, checkout / name)
    (checkout / ".venv").symlink_to(sys.prefix)
    deps = stand_in_dependencies(tmp_path / "deps")
    # `python3` is the test venv's interpreter; nothing else of the test venv is on PATH.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(sys.executable)
    env = offline_env(tmp_path, f"{bin_dir}:/usr/bin:/bin")

    # make wheel runs in the test venv as this process does: with its PYTHONPATH, if any.
    run(server_commands[0], checkout, {**env, "PYTHONPATH": os.environ.get("PYTHONPATH", "")})
    assert (checkout / WHEEL).is_file()
    *installs, serve = server_commands[1:]
    venv = tmp_path / ".mlxcel"
    for command in installs:
        run(command, checkout, env)
        if "-m venv" in command:
            see_dependencies(venv, deps)
    installed = venv / "bin"
    assert serve == "~/.mlxcel/bin/mlxcel serve"
    assert run("~/.mlxcel/bin/mlxcel --version", checkout, env).split() == ["mlxcel", VERSION]
    assert "--embedding-model" in run("~/.mlxcel/bin/mlxcel serve --help", checkout, env)
    assert site_of(installed / "python", env) == next(venv.glob("lib/python*/site-packages"))
    # The last command serves until stopped: here on a free port, stopped once /health is ok.
    port = free_port()
    log = tmp_path / "serve.log"
    with (
        log.open("wb") as out,
        subprocess.Popen(
            [*shlex.split(serve.replace("~", str(tmp_path))), "--port", str(port)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        ) as process,
    ):
        try:
            wait_healthy(port, process, log)
            # The playground's files are package data: the wheel must carry them.
            page = httpx.get(f"http://127.0.0.1:{port}/", timeout=30)
            assert page.status_code == 200 and "<html" in page.text.lower()
        finally:
            process.terminate()
            process.wait(30)

    # The client, into a project's venv (activated: its pip is the first on PATH).
    project = tmp_path / "project"
    run(f"python3 -m venv {project}", tmp_path, env)
    see_dependencies(project, deps)
    project_env = {**env, "PATH": f"{project / 'bin'}:{env['PATH']}", "VIRTUAL_ENV": str(project)}
    for command in client_commands:
        run(command, checkout, project_env)
    assert site_of(project / "bin" / "python", project_env) == next(
        project.glob("lib/python*/site-packages")
    )
    requires = run(
        "python -c \"import importlib.metadata as m; print('\\n'.join(m.requires('mlxcel')))\"",
        tmp_path,
        project_env,
    )
    plain = {line.split(">")[0] for line in requires.splitlines() if "extra ==" not in line}
    assert plain == {"openai", "httpx"}


def wait_healthy(port: int, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + READY_S
    while time.monotonic() < deadline:
        assert process.poll() is None, log.read_text()
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"no /health within {READY_S} s: {log.read_text()}")
