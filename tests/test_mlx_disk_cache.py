"""The disk prompt cache (--cache-disk) on the MLX engine: mlx-lm's KV caches as safetensors
bytes (backends/mlx/kv_state.py) outlive a SIGTERM and give the cold run's answer."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("mlx_lm")

from tests.conftest import LLAMA_DIR, start
from tests.server_process import ServerProcess
from tests.test_disk_cache import _ask, _same

# The tiny model's tokenizer spends ~16 tokens on each sentence: ~2,400 tokens (under a
# second on the tiny model; its worker's start, importing MLX, is most of the test's time).
REPEAT = 150


def _serve(models: Path, tmp: Path, disk: Path, name: str) -> ServerProcess:
    model = ["-m", str(models / LLAMA_DIR), "--backend", "mlx", "-c", "4096"]
    folder = tmp / name
    folder.mkdir()
    return start(folder, *model, "--cache-disk", str(disk), "--cache-ram", "0")


@pytest.mark.slow
def test_an_mlx_prefix_outlives_sigterm(models: Path, tmp_path: Path) -> None:
    disk = tmp_path / "disk"
    first = _serve(models, tmp_path, disk, "first")
    try:
        cold, prompt_tokens, cached = _ask(first, "the moon", REPEAT)
        assert cached == 0 and prompt_tokens > 2000
    finally:
        first.stop()
    assert len(list(disk.glob("*/*.kvc"))) == 1
    second = _serve(models, tmp_path, disk, "second")
    try:
        warm, _, cached = _ask(second, "the moon", REPEAT)
        assert _same(warm, cold) and cached >= 0.95 * prompt_tokens
        assert second.metric("mlxcel_prompt_cache_disk_loads_total") == 1
        # With no RAM tier, the state a new prefix displaces goes straight to disk.
        _ask(second, "volcanoes", REPEAT)
        again, _, cached = _ask(second, "the moon", REPEAT)
        assert _same(again, cold) and cached >= 0.95 * prompt_tokens
    finally:
        second.stop()
