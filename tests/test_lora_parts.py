"""The parts of LoRA support that need no server: the config file's and the flags' adapters,
and the engine's sets (compared by content, taking turns, keying the slot pool and the
prompt cache)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from mlxcel.cli.arguments import serve_arguments
from mlxcel.cli.main import _config
from mlxcel.config.adapters import LoraAdapter
from mlxcel.config.settings import ServerConfig
from mlxcel.engine.adapters import ADAPTER_TURN_STEPS, Turns, adapter_set
from mlxcel.engine.cache_tiers import CacheTiers, adapter_tag
from mlxcel.engine.disk_cache import DiskCache, StateKey
from mlxcel.engine.prompt_cache import PromptCache
from mlxcel.engine.slots import SlotPool
from mlxcel.weights import default_model_path


def test_a_set_drops_zero_scales_and_sorts() -> None:
    assert adapter_set({"b": 0.5, "a": 1.0, "c": 0.0}) == (("a", 1.0), ("b", 0.5))
    assert adapter_set({"a": 0.0}) == ()
    with pytest.raises(ValueError, match="finite"):
        adapter_set({"a": float("nan")})


def test_sets_take_turns_and_one_set_keeps_the_engine() -> None:
    one, two = (("a", 1.0),), (("b", 1.0),)
    turns = Turns()
    assert [turns.pick([one, one]) for _ in range(10)] == [one] * 10
    picked = [turns.pick([one, two]) for _ in range(4 * ADAPTER_TURN_STEPS)]
    assert picked.count(one) == picked.count(two) == 2 * ADAPTER_TURN_STEPS
    runs = [picked[i : i + ADAPTER_TURN_STEPS] for i in range(0, len(picked), ADAPTER_TURN_STEPS)]
    assert all(len(set(run)) == 1 for run in runs)
    assert turns.pick([two]) == two  # the set that is left runs at once


def test_a_slot_shares_its_prefix_only_with_its_own_set() -> None:
    pool = SlotPool(1)
    pool.claim(0, "r1", 0, (("a", 1.0),))
    pool.fed(0, [1, 2, 3, 4])
    pool.release(0, keep=True)
    assert pool.choose([1, 2, 3, 4, 5], adapters=(("a", 1.0),)) == (0, 4)
    assert pool.choose([1, 2, 3, 4, 5], adapters=(("a", 0.5),)) == (0, 0)
    assert pool.choose([1, 2, 3, 4, 5]) == (0, 0)


def test_the_prompt_cache_keeps_each_set_apart() -> None:
    cache = PromptCache(max_bytes=-1)
    cache.put([1, 2, 3], b"alpha", (("a", 1.0),))
    cache.put([1, 2], b"base")
    assert len(cache) == 2  # the base's shorter prefix is not dropped for alpha's longer one
    entry, shared = cache.best([1, 2, 3, 4])
    assert entry is not None and entry.data == b"base" and shared == 2
    entry, shared = cache.best([1, 2, 3, 4], (("a", 1.0),))
    assert entry is not None and entry.data == b"alpha" and shared == 3
    assert cache.best([1, 2, 3, 4], (("b", 1.0),)) == (None, 0)
    cache.take(entry)
    assert len(cache) == 1 and cache.total_bytes == len(b"base")


def test_the_disk_tier_keeps_each_set_apart(tmp_path: Path) -> None:
    """What the RAM tier lets go reaches disk tagged with its adapter set, and only a prompt
    run with the same set finds it there (the tiers' drain carries the set too)."""
    key = StateKey("model", "llamacpp 1", "f16/f16", "ctx 512")
    tiers = CacheTiers(0, DiskCache(tmp_path, key, max_bytes=-1))
    alpha = (("a", 1.0),)
    tiers.ram.put([1, 2, 3, 4], b"alpha", alpha)  # past the RAM tier's room: spilled to disk
    tiers.ram.put([1, 2, 3], b"base")
    disk = tiers.disk
    assert disk is not None
    tiers.drain(_NoSlots(), [], _NoMetrics())  # waits for the writer
    entry, shared = disk.best([1, 2, 3, 4, 5], adapter_tag(alpha))
    assert entry is not None and shared == 4 and disk.read(entry) == b"alpha"
    entry, shared = disk.best([1, 2, 3, 4, 5], adapter_tag(()))
    assert entry is not None and shared == 3 and disk.read(entry) == b"base"
    assert disk.best([1, 2, 3, 4, 5], adapter_tag((("b", 1.0),))) == (None, 0)


class _NoSlots:
    def save_state(self, slot: int) -> bytes:
        raise AssertionError("no slot to save")


class _NoMetrics:
    def disk_size(self, entries: int, total_bytes: int) -> None:
        pass


def _serve(*argv: str) -> ServerConfig:
    parser = argparse.ArgumentParser()
    serve_arguments(parser)
    return _config(parser, parser.parse_args(argv))


def test_config_file_and_flag_adapters(tmp_path: Path) -> None:
    for name in ("cats.gguf", "dogs.gguf"):
        (tmp_path / name).write_bytes(b"")
    config = tmp_path / "models.yaml"
    config.write_text(
        "models:\n"
        f"  - model: {default_model_path()}\n"
        "    lora_adapters:\n"
        f"      - {{name: kitten, path: {tmp_path / 'cats.gguf'}, scale: 0.5}}\n"
        f"      - {{path: {tmp_path / 'dogs.gguf'}}}\n"
        "    lora_init_without_apply: true\n"
        f"  - model: {default_model_path()}\n"
        "    name: second\n"
        "    lora_paths: [cats.gguf, dogs.gguf]\n"  # beside the file
        "    lora_scales: [0.25, 2]\n"
    )
    first, second = _serve("--config", str(config)).models
    assert first.lora_adapters == (
        LoraAdapter("kitten", tmp_path / "cats.gguf", 0.5),
        LoraAdapter("dogs", tmp_path / "dogs.gguf", 1.0),
    )
    assert first.lora_init_without_apply
    assert [(a.name, a.scale) for a in second.lora_adapters] == [("cats", 0.25), ("dogs", 2.0)]
    with pytest.raises(SystemExit):
        _serve("--config", str(config), "--lora", str(tmp_path / "cats.gguf"))
    (flagged,) = _serve(
        "--lora", str(tmp_path / "cats.gguf"), "--lora-scaled", f"{tmp_path / 'dogs.gguf'}:0.3"
    ).models
    assert [(a.name, a.scale) for a in flagged.lora_adapters] == [("cats", 1.0), ("dogs", 0.3)]


@pytest.mark.parametrize(
    "adapters",
    [
        "    lora_paths: [PATH/cats.gguf]\n    lora_scales: [1, 2]\n",
        "    lora_adapters: [{path: PATH/missing.gguf}]\n",
        "    lora_adapters: [{path: PATH/cats.gguf, scale: .nan}]\n",
        "    lora_adapters: [{path: PATH/cats.gguf}, {path: PATH/cats.gguf}]\n",
        "    lora_adapters: [{path: PATH/cats.gguf, weight: 2}]\n",
    ],
)
def test_bad_config_adapters_stop_the_start(
    tmp_path: Path, adapters: str, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "cats.gguf").write_bytes(b"")
    config = tmp_path / "models.yaml"
    model = f"models:\n  - model: {default_model_path()}\n"
    config.write_text(model + adapters.replace("PATH", str(tmp_path)))
    with pytest.raises(SystemExit) as ended:
        _serve("--config", str(config))
    assert ended.value.code == 2
    assert "lora" in capsys.readouterr().err.lower()
