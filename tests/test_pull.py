"""`mlxcel pull`, `list` and `rm` against a stand-in for the Hugging Face Hub on loopback
(tests/fake_hub.py, HF_ENDPOINT pointed at it): a GGUF file chosen by its quantisation, a
model folder, resuming within a pull and across pulls, the free-space check, the errors in one
line, the listing, and removal (refused while a process holds the file)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import ollama
import pytest

from tests._client_util import default_gguf
from tests.conftest import start
from tests.fake_hub import FakeHub, fake_hub

MIB = 1 << 20
# Past huggingface_hub's 10 MiB download chunk, so that a cut file has a part to resume from.
BIG = b"GGUF" + os.urandom(24 * MIB)
SMALL = b"GGUF" + os.urandom(4096)
FOLDER = {
    "config.json": b'{"model_type": "llama"}',
    "model.safetensors": os.urandom(8192),
    "tokenizer.json": b"{}",
    "README.md": b"not a model file",
}


@pytest.fixture
def hub() -> Iterator[FakeHub]:
    repos = {
        "org/tiny-GGUF": {"tiny-Q4_K_M.gguf": BIG, "tiny-Q8_0.gguf": SMALL, "README.md": b"hi"},
        "org/tiny-mlx": FOLDER,
    }
    with fake_hub(FakeHub(repos, gated={"org/gated"})) as served:
        yield served


def _env(hub: FakeHub, cache: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    return {**env, "HF_ENDPOINT": hub.url, "HF_HUB_CACHE": str(cache), **extra}


def mlxcel(hub: FakeHub, cache: Path, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mlxcel.cli", *args],
        env=_env(hub, cache, **extra),
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )


def test_pull_a_quantisation_resuming_a_cut_connection(hub: FakeHub, tmp_path: Path) -> None:
    hub.cut_once.add("tiny-Q4_K_M.gguf")
    done = mlxcel(hub, tmp_path, "pull", "org/tiny-GGUF:q4_k_m")
    assert done.returncode == 0, done.stderr
    path = Path(done.stdout.strip())
    assert path.name == "tiny-Q4_K_M.gguf" and path.read_bytes() == BIG
    assert path.is_relative_to(tmp_path / "models--org--tiny-GGUF" / "snapshots")
    # The cut file was resumed where its written part ended, not fetched again.
    (first, second) = [r for name, r in hub.ranges if name == "tiny-Q4_K_M.gguf"]
    assert first is None and second == f"bytes={10 * MIB}-"
    assert "tiny-Q8_0.gguf" not in {name for name, _ in hub.ranges}


def test_an_interrupted_pull_resumes_on_the_next(hub: FakeHub, tmp_path: Path) -> None:
    hub.stall_once.add("tiny-Q4_K_M.gguf")
    command = [sys.executable, "-m", "mlxcel.cli", "pull", "org/tiny-GGUF:tiny-Q4_K_M.gguf"]
    first = subprocess.Popen(command, env=_env(hub, tmp_path), stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    parts: list[Path] = []
    while not any(p.stat().st_size >= 10 * MIB for p in parts):
        assert time.monotonic() < deadline and first.poll() is None
        time.sleep(0.1)
        parts = list(tmp_path.rglob("*.part"))
    first.kill()
    first.wait()
    hub.release.set()
    done = mlxcel(hub, tmp_path, "pull", "org/tiny-GGUF:tiny-Q4_K_M.gguf")
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()).read_bytes() == BIG
    assert hub.ranges[-1] == ("tiny-Q4_K_M.gguf", f"bytes={10 * MIB}-")


def test_pull_a_model_folder(hub: FakeHub, tmp_path: Path) -> None:
    done = mlxcel(hub, tmp_path, "pull", "org/tiny-mlx", "--dir", str(tmp_path / "here"))
    assert done.returncode == 0, done.stderr
    folder = Path(done.stdout.strip())
    assert folder == tmp_path / "here"
    assert sorted(p.name for p in folder.iterdir() if p.is_file()) == [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
    ]


@pytest.mark.parametrize(
    ("args", "env", "says"),
    [
        (["org/missing"], {}, "org/missing: no such model on the Hugging Face Hub"),
        (["org/gated"], {}, "org/gated is gated: accept its terms on the Hub"),
        (["org/tiny-GGUF:Q2_K"], {}, "has no file or quantisation 'Q2_K'; it has: tiny-Q4_K_M"),
        (["org/tiny-GGUF"], {}, "holds several GGUF files: choose one, as org/tiny-GGUF:Q4_K_M"),
        (["not a repo"], {}, "is not a Hugging Face repo: give ORG/NAME"),
        (["org/tiny-mlx"], {"HF_HUB_OFFLINE": "1"}, "HF_HUB_OFFLINE is set"),
    ],
)
def test_a_pull_that_cannot_be_done_says_why_in_one_line(
    hub: FakeHub, tmp_path: Path, args: list[str], env: dict[str, str], says: str
) -> None:
    done = mlxcel(hub, tmp_path, "pull", *args, **env)
    assert done.returncode == 1
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("mlxcel pull: error: ") and says in line, line
    assert not list(tmp_path.rglob("*.gguf"))


def test_a_pull_past_the_free_space_never_starts(hub: FakeHub, tmp_path: Path) -> None:
    hub.sizes["tiny-Q8_0.gguf"] = 1 << 60
    done = mlxcel(hub, tmp_path, "pull", "org/tiny-GGUF:Q8_0")
    assert done.returncode == 1
    assert "not enough free disk space: the pull needs" in done.stderr
    assert not [name for name, _ in hub.ranges]


def test_list_and_rm(hub: FakeHub, tmp_path: Path) -> None:
    for model in ("org/tiny-GGUF:Q8_0", "org/tiny-mlx"):
        assert mlxcel(hub, tmp_path, "pull", model).returncode == 0
    listed = mlxcel(hub, tmp_path, "list", "--json")
    rows = {row["name"]: row for row in map(json.loads, listed.stdout.splitlines())}
    assert rows["org/tiny-GGUF:tiny-Q8_0.gguf"]["quantization"] == "Q8_0"
    assert rows["org/tiny-GGUF:tiny-Q8_0.gguf"]["size"] == len(SMALL)
    assert rows["org/tiny-mlx"]["kind"] == "folder"
    assert rows["default"]["kind"] == "gguf"
    table = mlxcel(hub, tmp_path, "list").stdout
    assert table.splitlines()[0].split() == ["NAME", "KIND", "SIZE", "QUANT", "PATH"]

    # Nobody to ask: --yes is needed.
    refused = mlxcel(hub, tmp_path, "rm", "org/tiny-mlx")
    assert refused.returncode == 1 and "needs --yes" in refused.stderr
    # A process holding the file (a server serving it) keeps it.
    gguf = Path(rows["org/tiny-GGUF:tiny-Q8_0.gguf"]["path"])
    holder = subprocess.Popen(
        [sys.executable, "-c", f"f = open({str(gguf)!r}, 'rb'); import time; time.sleep(60)"]
    )
    try:
        time.sleep(1)
        held = mlxcel(hub, tmp_path, "rm", "--yes", "org/tiny-GGUF:tiny-Q8_0.gguf")
        assert held.returncode == 1 and f"in use by process {holder.pid}" in held.stderr
    finally:
        holder.kill()
        holder.wait()
    assert mlxcel(hub, tmp_path, "rm", "--yes", "org/tiny-GGUF:tiny-Q8_0.gguf").returncode == 0
    assert mlxcel(hub, tmp_path, "rm", "-y", "org/tiny-mlx").returncode == 0
    rest = mlxcel(hub, tmp_path, "list", "--json").stdout.splitlines()
    names = {json.loads(row)["name"] for row in rest}
    assert not {n for n in names if n.startswith("org/")}
    assert not (tmp_path / "models--org--tiny-mlx").exists()
    unknown = mlxcel(hub, tmp_path, "rm", "-y", "org/never")
    assert unknown.returncode == 1 and "is not in the Hugging Face cache" in unknown.stderr


def test_pull_over_http_with_progress_then_load_and_serve(hub: FakeHub, tmp_path: Path) -> None:
    """POST /models/pull answers at once with an id; its events show bytes coming and end with
    done; the pulled GGUF is added to the running server by POST /models/load with a path and
    answers a chat; DELETE /models/NAME refuses it while it is loaded, removes it after."""
    gguf = default_gguf().read_bytes()
    hub.repos["org/served-GGUF"] = {"served-Q4_1.gguf": gguf}
    hub.cut_once.add("served-Q4_1.gguf")
    env = {"HF_ENDPOINT": hub.url, "HF_HUB_CACHE": str(tmp_path / "cache")}
    for folder in ("closed", "open"):
        (tmp_path / folder).mkdir()
    closed = start(tmp_path / "closed", "--threads", "1", env=env)
    try:
        with closed.http() as http:
            refused = http.post("/models/pull", json={"model": "org/served-GGUF"})
            assert refused.status_code == 403
            assert refused.json()["error"]["code"] == "downloads_disabled"
    finally:
        closed.stop()
    server = start(tmp_path / "open", "--threads", "1", "--allow-downloads", env=env)
    try:
        with server.http() as http:
            started = http.post("/models/pull", json={"model": "org/served-GGUF:Q4_1"})
            assert started.status_code == 202, started.text
            job = started.json()
            assert job["status"] == "running" and job["total_bytes"] == len(gguf)
            with http.stream("GET", f"/models/pull/{job['id']}/events") as events:
                lines = [
                    json.loads(line[6:]) for line in events.iter_lines() if line[:6] == "data: "
                ]
            assert lines[-1]["type"] == "done" and lines[-1]["done_bytes"] == len(gguf)
            assert all(e["type"] == "progress" for e in lines[:-1])
            path = lines[-1]["path"]
            assert Path(path).read_bytes() == gguf
            assert http.get(f"/models/pull/{job['id']}").json()["status"] == "done"
            for body, status in (
                ({"model": "nobody/nothing"}, 400),
                ({"model": "org/served-GGUF:Q9"}, 400),
                ({"model": "org/served-GGUF", "extra": 1}, 400),
            ):
                assert http.post("/models/pull", json=body).status_code == status, body
            assert http.get("/models/pull/pull-99").status_code == 404

            # A cancelled pull stops at its next chunk; the next pull resumes its part.
            hub.stall_once.add("tiny-Q4_K_M.gguf")
            big = http.post("/models/pull", json={"model": "org/tiny-GGUF:Q4_K_M"}).json()
            deadline = time.monotonic() + 60
            while http.get(f"/models/pull/{big['id']}").json()["done_bytes"] < 10 * MIB:
                assert time.monotonic() < deadline
                time.sleep(0.1)
            assert http.delete(f"/models/pull/{big['id']}").status_code == 200
            hub.release.set()
            while http.get(f"/models/pull/{big['id']}").json()["status"] == "running":
                assert time.monotonic() < deadline
                time.sleep(0.1)
            assert http.get(f"/models/pull/{big['id']}").json()["status"] == "cancelled"
            again = http.post("/models/pull", json={"model": "org/tiny-GGUF:Q4_K_M"}).json()
            while http.get(f"/models/pull/{again['id']}").json()["status"] == "running":
                assert time.monotonic() < deadline
                time.sleep(0.1)
            assert http.get(f"/models/pull/{again['id']}").json()["status"] == "done"
            assert hub.ranges[-1] == ("tiny-Q4_K_M.gguf", f"bytes={10 * MIB}-")

            name = "org/served-GGUF:served-Q4_1.gguf"
            loaded = http.post("/models/load", json={"model": "pulled", "path": name})
            assert loaded.status_code == 200, loaded.text
            chat = {"model": "pulled", "messages": [{"role": "user", "content": "Hi"}]}
            answer = http.post("/v1/chat/completions", json={**chat, "max_tokens": 2})
            assert answer.status_code == 200 and answer.json()["model"] == "pulled"
            held = http.delete(f"/models/{name}")
            assert held.status_code == 409 and "in use by process" in held.text
            assert http.post("/models/unload", json={"model": "pulled"}).status_code == 200
            gone = http.delete(f"/models/{name}")
            assert gone.status_code == 200, gone.text
            assert not Path(path).exists()
            missing = http.post("/models/load", json={"model": "x", "path": "/nowhere.gguf"})
            assert missing.status_code == 400 and missing.json()["error"]["param"] == "path"
    finally:
        server.stop()


def test_ollama_pull_and_delete(hub: FakeHub, tmp_path: Path) -> None:
    """Ollama's client pulls a Hugging Face repo as Ollama names one, with its status lines
    and byte counts, and deletes it; a name of Ollama's own library is a clear 400."""
    env = {"HF_ENDPOINT": hub.url, "HF_HUB_CACHE": str(tmp_path / "cache")}
    server = start(tmp_path, "--threads", "1", "--allow-downloads", env=env)
    try:
        client = ollama.Client(host=server.root)
        lines = list(client.pull("hf.co/org/tiny-GGUF:Q8_0", stream=True))
        assert lines[0].status == "pulling manifest" and lines[-1].status == "success"
        counted = [line for line in lines if line.total]
        assert counted and counted[-1].completed == counted[-1].total == len(SMALL)
        assert client.pull("hf.co/org/tiny-mlx").status == "success"
        cached = tmp_path / "cache" / "models--org--tiny-GGUF"
        assert next(cached.rglob("tiny-Q8_0.gguf")).read_bytes() == SMALL
        client.delete("hf.co/org/tiny-GGUF:tiny-Q8_0.gguf")
        assert not list(cached.rglob("tiny-Q8_0.gguf"))
        with pytest.raises(ollama.ResponseError) as caught:
            client.pull("llama3.2")
        assert caught.value.status_code == 400 and "hf.co/ORG/NAME" in caught.value.error
        with pytest.raises(ollama.ResponseError) as gone:
            client.delete("hf.co/org/never")
        assert gone.value.status_code == 404
    finally:
        server.stop()
