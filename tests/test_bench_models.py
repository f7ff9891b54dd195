"""bench/models.py's random-weight GGUFs, tiny: llama.cpp loads them, generates, mlxcel serves."""

from __future__ import annotations

from pathlib import Path

import llama_cpp
import pytest
from bench.models import SHAPES, build, tiny
from gguf import LlamaFileType

from tests.conftest import start

pytestmark = pytest.mark.slow


TINY_LLAMA = tiny(SHAPES["smollm2-135m"])
TINY_QWEN2 = tiny(SHAPES["qwen2.5-0.5b"])


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("bench-models")


@pytest.fixture(scope="module")
def tiny_llama(cache: Path) -> Path:
    built = build(TINY_LLAMA, cache)
    assert built.seconds is not None
    return built.path


def _load(path: Path) -> llama_cpp.Llama:
    return llama_cpp.Llama(str(path), n_ctx=128, n_threads=1, verbose=False)


def test_a_second_build_is_the_cached_file(cache: Path, tiny_llama: Path) -> None:
    again = build(TINY_LLAMA, cache)
    assert again.path == tiny_llama
    assert again.seconds is None


def test_llama_cpp_loads_it_as_q4_0_and_generates(tiny_llama: Path) -> None:
    llm = _load(tiny_llama)
    assert llm.metadata["general.architecture"] == "llama"
    assert llm.metadata["general.file_type"] == str(int(LlamaFileType.MOSTLY_Q4_0))
    assert llm.metadata["llama.block_count"] == "2"
    assert llm.n_vocab() == 49152
    out = llm.create_completion("The cat sat on the", max_tokens=8, temperature=0)
    assert out["usage"]["prompt_tokens"] == len(llm.tokenize(b"The cat sat on the"))
    assert out["usage"]["completion_tokens"] > 0


def test_qwen2_vocabulary_is_padded_with_tokens_that_have_text(cache: Path) -> None:
    llm = _load(build(TINY_QWEN2, cache).path)
    assert llm.n_vocab() == 151936
    assert llm.detokenize([151935]) == b"[PAD151935]"
    out = llm.create_completion("The cat sat on the", max_tokens=8, temperature=0)
    assert out["usage"]["completion_tokens"] > 0


def test_mlxcel_serves_it(tiny_llama: Path, tmp_path: Path) -> None:
    server = start(tmp_path, "-m", str(tiny_llama), "--ctx-size", "512")
    try:
        client = server.openai()
        reply = client.chat.completions.create(
            model="default",
            messages=[{"role": "user", "content": "Hello"}],
            max_tokens=8,
            temperature=0,
            extra_body={"ignore_eos": True},
        )
    finally:
        server.stop()
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage is not None and reply.usage.completion_tokens == 8
