"""Speculative decoding with a draft model (-md): the same output as without it, solo and
batched, greedy and seeded; drafts counted in `timings` and /metrics; bad drafts refused.

The draft model is the default model itself: under greedy decoding it drafts what the model
chooses, so drafts are taken and the test sees the accepting path as well as the rejecting
one (a draft cut where the request's own sampling differs)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests._client_util import default_gguf
from tests.conftest import serving
from tests.server_process import ServerProcess
from tests.test_models import _refused
from tests.test_speculative import _complete, _metrics, batched_matches_solo
from tests.test_startup import _serve

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def drafted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    flags = ("--ctx-size", "4096", "--parallel", "2", "-md", str(default_gguf()))
    yield from serving(tmp_path_factory, "draft", *flags, "--draft-max", "6")


def test_greedy_output_is_the_same_with_a_draft_model(
    server: ServerProcess, drafted: ServerProcess
) -> None:
    before = _metrics(drafted)
    plain, answer = _complete(server), _complete(drafted)
    after = _metrics(drafted)
    assert answer["choices"][0]["text"] == plain["choices"][0]["text"]
    timings = answer["timings"]
    assert timings["predicted_n"] == plain["timings"]["predicted_n"] == 48
    # Its own greedy choice is the model's: what it drafts confidently is taken.
    assert 0 < timings["draft_n_accepted"] <= timings["draft_n"]
    # Verification is timed at the lengths drafts are cut to: 1, 3 and --draft-max.
    assert re.search(
        r"verifying d drafted tokens costs \(d: one-token decodes\) "
        r"1: \d+\.\d\d, 3: \d+\.\d\d, 6: \d+\.\d\d \(measured\)",
        drafted.log(),
    )
    assert after[0] - before[0] == timings["draft_n"]
    assert after[1] - before[1] == timings["draft_n_accepted"]
    assert after[2] > before[2]


def test_seeded_sampling_is_the_same_with_a_draft_model(
    server: ServerProcess, drafted: ServerProcess
) -> None:
    sampled = {"temperature": 0.9, "seed": 99, "top_k": 0, "top_p": 1.0, "min_p": 0.0}
    plain, answer = _complete(server, **sampled), _complete(drafted, **sampled)
    assert answer["choices"][0]["text"] == plain["choices"][0]["text"]


def test_batched_drafts_match_solo_output(server: ServerProcess, drafted: ServerProcess) -> None:
    batched_matches_solo(server, drafted, "Explain this code.")


def test_bad_draft_models_are_refused(tmp_path: Path, fim_gguf: Path) -> None:
    absent = tmp_path / "absent.gguf"
    assert _refused(tmp_path, "-md", str(absent)).endswith(f"--model-draft {absent}: no such file")
    gguf = str(default_gguf())
    assert _refused(tmp_path, "-md", gguf, "--spec-type", "ngram-simple").endswith(
        "--spec-type ngram-simple and --model-draft: choose one way to draft"
    )
    config = tmp_path / "draft.yaml"
    config.write_text(f"models:\n  - model_path: {gguf}\n    draft_model_path: {absent}\n")
    assert _refused(tmp_path, "--config", str(config)).endswith(
        f"models[0]: --model-draft {absent}: no such file"
    )
    # The same size of vocabulary, but FIM tokens where SmolLM2 has others.
    code, lines = _serve("-m", gguf, "-md", str(fim_gguf), "--no-warmup")
    assert code == 2
    assert (
        "has another vocabulary than the model (token 7 is b'<gh_stars>' in the model"
        in (lines[-1])
    ), lines
    assert str(fim_gguf) in lines[-1]
