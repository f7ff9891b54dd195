"""Speculative decoding by prompt lookup: the same output as without it, solo and batched,
greedy and seeded; drafts counted in `timings` and /metrics; bad flags refused."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests._client_util import default_gguf
from tests.conftest import ok, serving
from tests.server_process import ServerProcess
from tests.test_models import _refused

pytestmark = pytest.mark.slow

TEXT = (
    "def area(width, height):\n    return width * height\n\n"
    "def perimeter(width, height):\n    return 2 * (width + height)\n\n"
    "def volume(width, height, depth):\n    return width * height * depth\n"
)
PROMPT = f"Copy this code.\n\n{TEXT}\nCopy:\n\n"
GREEDY: dict[str, Any] = {"max_tokens": 48, "temperature": 0, "ignore_eos": True}
METRICS = ("draft_tokens", "accepted_tokens", "drafts")
# Two slots, to batch; 3-token n-grams, so drafts come often. A drafted token's cost is set,
# not measured: measured on a loaded machine it can reach a whole decode's, where no draft pays
# (the draft model's tests measure it).
SPEC_FLAGS = ("--ctx-size", "4096", "--parallel", "2", "--spec-type", "ngram-simple")
SPEC_FLAGS += ("--spec-ngram-simple-size-n", "3", "--draft-cost", "0.5")


@pytest.fixture(scope="module")
def spec(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    yield from serving(tmp_path_factory, "spec", *SPEC_FLAGS)


def _complete(server: ServerProcess, **body: Any) -> dict[str, Any]:
    with server.http() as http:
        answer: dict[str, Any] = ok(
            http.post("/v1/completions", json={"prompt": PROMPT, **GREEDY, **body})
        )
    return answer


def _metrics(server: ServerProcess) -> list[float]:
    return [server.metric(f"mlxcel_spec_decode_{name}_total") for name in METRICS]


def test_greedy_output_is_the_same_with_speculation(
    server: ServerProcess, spec: ServerProcess
) -> None:
    plain, drafted = _complete(server), _complete(spec)
    assert drafted["choices"][0]["text"] == plain["choices"][0]["text"]
    assert "draft_n" not in plain["timings"]
    assert "a drafted token costs 0.50 of a one-token decode (--draft-cost)" in spec.log()
    timings = drafted["timings"]
    assert timings["predicted_n"] == 48
    assert 0 <= timings.get("draft_n_accepted", 0) <= timings.get("draft_n", 0)


def test_forced_copy_is_drafted_and_accepted(server: ServerProcess, spec: ServerProcess) -> None:
    # A grammar makes the output a copy of the code, so its n-grams are the prompt's.
    literal = TEXT.replace("\n", "\\n")
    grammar = {"grammar": f'root ::= "{literal}"', "max_tokens": 120}
    before = _metrics(spec)
    plain, drafted = _complete(server, **grammar), _complete(spec, **grammar)
    after = _metrics(spec)
    assert drafted["choices"][0]["text"] == plain["choices"][0]["text"] == TEXT
    timings = drafted["timings"]
    assert 0 < timings["draft_n_accepted"] <= timings["draft_n"]
    assert after[0] - before[0] == timings["draft_n"]
    assert after[1] - before[1] == timings["draft_n_accepted"]
    assert after[2] > before[2]
    with spec.http() as http:
        assert "mlxcel_spec_decode_acceptance_ratio{" in http.get("/metrics").text
    # The same tokens either way: accepted drafts are tokens the model would have chosen.
    assert timings["predicted_n"] == plain["timings"]["predicted_n"]


def test_seeded_sampling_is_the_same_with_speculation(
    server: ServerProcess, spec: ServerProcess
) -> None:
    sampled = {"temperature": 0.7, "seed": 1234, "top_k": 0, "top_p": 1.0, "min_p": 0.0}
    plain, drafted = _complete(server, **sampled), _complete(spec, **sampled)
    assert drafted["choices"][0]["text"] == plain["choices"][0]["text"]


def batched_matches_solo(server: ServerProcess, drafting: ServerProcess, other: str) -> None:
    """Two prompts at once on the drafting server give what each gives alone on the plain one."""
    prompts = [PROMPT, PROMPT.replace("Copy this code.", other)]
    solo = [_complete(server, prompt=p)["choices"][0]["text"] for p in prompts]
    results: dict[int, str] = {}

    def run(index: int) -> None:
        results[index] = _complete(drafting, prompt=prompts[index])["choices"][0]["text"]

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [results[0], results[1]] == solo


def test_batched_speculation_matches_solo_output(
    server: ServerProcess, spec: ServerProcess
) -> None:
    batched_matches_solo(server, spec, "Repeat the code below.")


def test_bad_speculation_settings_are_refused(tmp_path: Path) -> None:
    assert "invalid choice: 'eagle'" in _refused(tmp_path, "--spec-type", "eagle")
    assert _refused(tmp_path, "--draft-max", "4", "--draft-min", "5").endswith(
        "--draft-min must be between 0 and --draft-max (4), got 5"
    )
    assert _refused(tmp_path, "--spec-ngram-simple-size-n", "0").endswith(
        "--spec-ngram-simple-size-n must be between 1 and 1024, got 0"
    )
    assert _refused(tmp_path, "--draft-cost", "-1").endswith(
        "argument --draft-cost: must be auto or at least 0, got '-1'"
    )
    assert _refused(tmp_path, "--draft-cost", "cheap").endswith(
        "argument --draft-cost: expected auto or a number, got 'cheap'"
    )
    assert _refused(tmp_path, "--spec-draft-n-max", "0").endswith(
        "--draft-max must be at least 1, got 0"
    )
    config = tmp_path / "spec.yaml"
    config.write_text(
        f"models:\n  - model_path: {default_gguf()}\n    spec_type: ngram-simple\n"
        "    draft_max: 2\n    draft_min: 3\n"
    )
    assert _refused(tmp_path, "--config", str(config)).endswith(
        "models[0]: --draft-min must be between 0 and --draft-max (2), got 3"
    )
