"""The prompt cache's disk tier (--cache-disk) and llama-server's slot files (--slot-save-path)
on llama.cpp: states outlive a SIGTERM, an idle unload and RAM eviction, are never reused by
another model file or KV type, and a bad file is skipped with a warning.

The servers run bench/models.py's two-layer GGUF (SmolLM2's vocabulary): a prefix of about 3,000
tokens evaluates in seconds at one thread, where the 30-layer default model would take minutes.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mlxcel.engine.cache_tiers import Crossover
from mlxcel.engine.disk_cache import MAGIC, DiskCache, StateKey, decode, encode, entry_name
from mlxcel.worker.prompt_store import model_hash
from tests.conftest import start
from tests.server_process import ServerProcess

KEY = StateKey("model-a", "llamacpp 1", "f16/f16", "ctx 4096")


def test_an_entry_comes_back_and_a_bad_one_is_skipped(tmp_path: Path, caplog: Any) -> None:
    cache = DiskCache(tmp_path, KEY, max_bytes=-1)
    assert cache.put([1, 2, 3], b"state")
    entry, shared = cache.best([1, 2, 3, 4])
    assert entry is not None and shared == 3 and cache.read(entry) == b"state"
    assert cache.best([1, 2, 3], tag="lora-x") == (None, 0)  # another state tag
    path = cache.folder / entry_name("", [1, 2, 3])
    data = path.read_bytes()
    assert decode(data, KEY.digest()) == ("", [1, 2, 3], b"state")
    with pytest.raises(ValueError, match="another model"):
        decode(data, StateKey("model-b", "llamacpp 1", "f16/f16", "ctx 4096").digest())
    # A damaged byte: found by the checksum at load, skipped once, removed.
    path.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    assert cache.read(entry) is None and not path.exists()
    # Truncated, random bytes, another key's entry: skipped when the folder is read.
    cache.put([5, 6], b"x" * 100)
    torn = cache.folder / entry_name("", [5, 6])
    torn.write_bytes(torn.read_bytes()[:-10])
    (cache.folder / ("0" * 40 + ".kvc")).write_bytes(os.urandom(300))
    foreign = encode(StateKey("model-b", "e", "k", "c").digest(), "", [7], b"y")
    (cache.folder / entry_name("", [7])).write_bytes(foreign)
    caplog.clear()
    assert cache.best([5, 6, 7]) == (None, 0) and cache.best([7]) == (None, 0)
    warnings = [r.getMessage() for r in caplog.records if "skipping" in r.getMessage()]
    assert len(warnings) == 3 and cache.entries == 0
    assert all(data.startswith(MAGIC) for data in [encode("k", "", [], b"")])


def test_the_limit_holds_least_recently_used_first(tmp_path: Path) -> None:
    one = len(encode(KEY.digest(), "", [1], b"x" * 1000))
    cache = DiskCache(tmp_path, KEY, max_bytes=3 * one)
    for token in (1, 2, 3):
        cache.put([token], b"x" * 1000)
        time.sleep(0.01)
    entry, _ = cache.best([1])
    assert entry is not None and cache.read(entry) is not None  # 1 is now the most recent
    cache.put([4], b"x" * 1000)
    assert cache.best([2]) == (None, 0) and cache.best([1])[1] == 1 and cache.entries == 3
    assert cache.total_bytes <= 3 * one
    assert not cache.put([9], b"x" * 5000)  # bigger than the whole limit: not written
    # An entry that extends another replaces it.
    cache.put([4, 5], b"x" * 10)
    assert cache.best([4])[0] is not None and cache.best([4])[0].tokens == (4, 5)  # type: ignore[union-attr]


def test_two_processes_on_one_folder_see_each_other(tmp_path: Path) -> None:
    first, second = DiskCache(tmp_path, KEY, -1), DiskCache(tmp_path, KEY, -1)
    first.put([1, 2], b"from the first")
    entry, _ = second.best([1, 2, 3])
    assert entry is not None and second.read(entry) == b"from the first"
    second.put([1, 2, 3], b"longer")  # removes [1, 2], which the first one indexed
    entry, shared = first.best([1, 2, 3, 4])
    assert entry is not None and shared == 3 and first.read(entry) == b"longer"


def test_the_model_hash_follows_the_content(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"a" * 1000)
    store = tmp_path / "store"
    store.mkdir()
    first = model_hash([model], store)
    assert model_hash([model], store) == first and (store / "model-hashes.json").exists()
    model.write_bytes(b"b" * 1000)
    os.utime(model, ns=(time.time_ns(), time.time_ns() + 10**9))
    assert model_hash([model], store) != first


def test_loading_is_chosen_only_where_measured_faster() -> None:
    crossover = Crossover()
    assert crossover.worth_loading(20, 10**9)  # nothing measured yet: load
    crossover.prefilled(1000, 1.0)  # 1 ms a token
    crossover.loaded(10**6, 0.001)  # 1 ns a byte
    assert crossover.worth_loading(100, 10**6)  # 3 ms against 100 ms
    assert not crossover.worth_loading(100, 10**9)  # a second against 100 ms
    assert not crossover.worth_loading(1, 10)  # the fixed cost of a load against 1 ms


# Servers: the same request before and after a SIGTERM, an idle unload, RAM eviction.


def _messages(topic: str, repeat: int) -> list[Any]:
    return [
        {"role": "system", "content": f"You are an expert on {topic}. " * repeat},
        {"role": "user", "content": f"Tell me about {topic}."},
    ]


def _ask(
    server: ServerProcess, topic: str, repeat: int = 400
) -> tuple[list[tuple[str, float]], int, int]:
    """For a ~3,000-token prompt on `topic`: the greedy answer's tokens with their
    log-probabilities, the
    prompt's tokens, and how many of them were cached."""
    answer = server.openai().chat.completions.create(
        model="default",
        messages=_messages(topic, repeat),
        max_tokens=8,
        temperature=0,
        logprobs=True,
    )
    usage, logprobs = answer.usage, answer.choices[0].logprobs
    assert usage is not None and usage.prompt_tokens_details is not None
    assert logprobs is not None and logprobs.content
    cached = usage.prompt_tokens_details.cached_tokens or 0
    tokens = [(t.token, t.logprob) for t in logprobs.content]
    return tokens, usage.prompt_tokens, cached


def _same(a: list[tuple[str, float]], b: list[tuple[str, float]]) -> bool:
    """The same greedy tokens, with log-probabilities that agree (a state loaded back is the
    cold run's; only the last prompt token is evaluated again, in a batch of another shape,
    which moves a logit by a few thousandths)."""
    return [t for t, _ in a] == [t for t, _ in b] and all(
        abs(x - y) < 0.05 for (_, x), (_, y) in zip(a, b, strict=True)
    )


def _config(tmp: Path, model: Path, disk: Path, slots: Path | None, *extra: str) -> Path:
    # 1 MiB of RAM: one ~3,000-token state (0.8 MiB), the next one sends it to disk.
    ram = [] if any(line.startswith("cache_ram") for line in extra) else ["cache_ram: 1"]
    lines = [
        "models:",
        f"  - model_path: {model}",
        "    name: default",
        "    ctx_size: 4096",
        *(f"    {line}" for line in ram),
        f"    cache_disk: {disk}",
        *([f"    slot_save_path: {slots}"] if slots else []),
        *(f"    {line}" for line in extra),
    ]
    path = tmp / f"config-{len(list(tmp.glob('config-*')))}.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory, tiny_gguf: Path) -> Iterator[dict[str, Path]]:
    tmp = tmp_path_factory.mktemp("disk-cache")
    model = tmp / "model.gguf"
    shutil.copyfile(tiny_gguf, model)
    yield {"tmp": tmp, "model": model, "disk": tmp / "disk", "slots": tmp / "slots"}


def _serve(setup: dict[str, Path], *extra: str, slots: bool = True) -> ServerProcess:
    tmp = setup["tmp"]
    config = _config(tmp, setup["model"], setup["disk"], setup["slots"] if slots else None, *extra)
    folder = tmp / config.stem
    folder.mkdir()
    return start(folder, "--config", str(config))


def _entries(setup: dict[str, Path]) -> list[Path]:
    return sorted(setup["disk"].glob("*/*.kvc"))


def _disk_loads(server: ServerProcess) -> float:
    return server.metric("mlxcel_prompt_cache_disk_loads_total")


@pytest.mark.slow
def test_a_prefix_outlives_sigterm_eviction_and_an_idle_unload(setup: dict[str, Path]) -> None:
    first = _serve(setup)
    try:
        moon, prompt_tokens, cached = _ask(first, "the moon")
        assert cached == 0 and prompt_tokens > 2500
    finally:
        first.stop()  # SIGTERM: the slot's state goes to disk
    assert "states written to disk" in first.log() and len(_entries(setup)) == 1
    server = _serve(setup, "idle_timeout: 4")
    try:
        again, _, cached = _ask(server, "the moon")
        assert _same(again, moon) and cached >= 0.95 * prompt_tokens
        assert _disk_loads(server) == 1
        assert server.metric("mlxcel_prompt_cache_disk_entries") == 1
        assert server.metric("mlxcel_prompt_cache_disk_bytes") > 0.5 * 2**20
        props = server.http().get("/props").json()["prompt_cache"]["disk"]
        assert props["hits"] == 1 and props["entries"] == 1 and props["load_ms"] > 0
        # RAM eviction: the volcano state leaves the 1 MiB RAM tier for disk when the moon's
        # comes in, and comes back from there.
        volcanoes, volcano_tokens, _ = _ask(server, "volcanoes")
        _ask(server, "the sea")
        back, _, cached = _ask(server, "volcanoes")
        assert _same(back, volcanoes) and cached >= 0.95 * volcano_tokens
        assert _disk_loads(server) == 2
        # An idle unload writes the slot's state out; the reload finds it.
        deadline = time.monotonic() + 60
        while "unloaded model 'default'" not in server.log():
            assert time.monotonic() < deadline, server.log()
            time.sleep(0.2)
        volcanoes_again, _, cached = _ask(server, "volcanoes")
        assert _same(volcanoes_again, volcanoes) and cached >= 0.95 * volcano_tokens
    finally:
        server.stop()


@pytest.mark.slow
def test_bad_files_another_model_and_another_kv_type_are_not_reused(
    setup: dict[str, Path], tiny_gguf: Path
) -> None:
    server = _serve(setup, "cache_ram: 0")  # what leaves the slot goes straight to disk
    try:
        moon, prompt_tokens, _ = _ask(server, "the moon")  # on disk since the last test
        assert _disk_loads(server) == 1
        _ask(server, "volcanoes")  # the moon leaves the slot for disk
        time.sleep(0.5)
        # Damage every entry, and add one of random bytes: each is skipped with a warning,
        # and the answer is the cold one.
        for entry in _entries(setup):
            entry.write_bytes(entry.read_bytes()[:-100])
        (_entries(setup)[0].parent / ("f" * 40 + ".kvc")).write_bytes(os.urandom(4096))
        again, _, cached = _ask(server, "the moon")
        assert _same(again, moon) and cached < prompt_tokens // 4
        assert server.log().count("prompt cache: skipping") >= 2
    finally:
        server.stop()
    other_kv = _serve(setup, "cache_type_k: f32")
    try:
        _, _, cached = _ask(other_kv, "the moon")
        assert cached == 0 and _disk_loads(other_kv) == 0
    finally:
        other_kv.stop()
    # The same path, other bytes (one letter of its name, its size kept): a changed file, whose
    # old states are not offered to it.
    data = setup["model"].read_bytes()
    at = data.index(b"random tiny-") + len(b"random tiny-")
    setup["model"].write_bytes(data[:at] + bytes([data[at] ^ 1]) + data[at + 1 :])
    changed = _serve(setup)
    try:
        _, _, cached = _ask(changed, "the moon")
        assert cached == 0 and _disk_loads(changed) == 0
    finally:
        changed.stop()
    shutil.copyfile(tiny_gguf, setup["model"])
    assert len({p.parent for p in _entries(setup)}) == 3  # one folder per key


@pytest.mark.slow
def test_slot_save_restore_erase(setup: dict[str, Path]) -> None:
    server = _serve(setup)
    http = server.http()
    try:
        moon, prompt_tokens, _ = _ask(server, "the sun")
        assert "/slots/{id_slot}" in http.get("/openapi.json").json()["paths"]
        saved = http.post("/slots/0?action=save", json={"filename": "sun.bin"})
        assert saved.status_code == 200, saved.text
        body = saved.json()
        assert body["id_slot"] == 0 and body["filename"] == "sun.bin"
        assert body["n_saved"] >= prompt_tokens and body["n_written"] > 0
        assert body["timings"]["save_ms"] >= 0 and (setup["slots"] / "sun.bin").exists()
        _ask(server, "rivers")
        restored = http.post("/slots/0?action=restore", json={"filename": "sun.bin"}).json()
        assert restored["n_restored"] == body["n_saved"] and restored["n_read"] > 0
        assert "restore_ms" in restored["timings"]
        # llama.cpp #26676: the restored tokens are found by the next request.
        again, _, cached = _ask(server, "the sun")
        assert _same(again, moon) and cached >= 0.95 * prompt_tokens
        erased = http.post("/slots/0?action=erase").json()
        assert erased == {"id_slot": 0, "n_erased": erased["n_erased"]}
        assert erased["n_erased"] > prompt_tokens
        for name in ("../escape.bin", "a/b", "..", ".hidden", ""):
            bad = http.post("/slots/0?action=save", json={"filename": name})
            assert bad.status_code == 400 and bad.json()["error"]["param"] == "filename"
        assert not (setup["slots"].parent / "escape.bin").exists()
        missing = http.post("/slots/0?action=restore", json={"filename": "nothing.bin"})
        assert missing.status_code == 400 and "Unable to restore" in missing.text
        assert http.post("/slots/0?action=fly", json={}).status_code == 400
        assert http.post("/slots/7?action=erase").status_code == 400
        # A second server on the same folder: what it writes, the first one finds.
        other = _serve(setup, slots=False)
        try:
            with other.http() as other_http:
                refused = other_http.post("/slots/0?action=erase")
                paths = other_http.get("/openapi.json").json()["paths"]
            assert refused.status_code == 501 and "--slot-save-path" in refused.text
            assert "/slots/{id_slot}" not in paths  # documented only where it is served
            rivers, river_tokens, _ = _ask(other, "rivers and lakes")
        finally:
            other.stop()  # its slot's state goes to the shared folder
        shared, _, cached = _ask(server, "rivers and lakes")
        assert _same(shared, rivers) and cached >= 0.95 * river_tokens
    finally:
        http.close()
        server.stop()
