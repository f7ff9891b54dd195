"""Code infill: llama-server's /infill and `suffix` on /v1/completions, on a GGUF with FIM."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from mlxcel.backends.llamacpp.generator import LlamaCppGenerator, LlamaCppOptions
from mlxcel.protocol.infill import ExtraFile
from mlxcel.serving.infill import FimLayout, infill_prompt
from tests._client_util import default_gguf
from tests.conftest import serving
from tests.server_process import ServerProcess

slow = pytest.mark.slow

# The FIM model's context and batch: prefix and suffix share one batch, 3:1 (the suffix's
# share less two), and the extra files get what the context has left past a batch and twice
# the answer's limit, or with no limit what still fits with one token of answer.
CTX, BATCH = 1024, 256
PREFIX_ROOM, SUFFIX_ROOM = 3 * BATCH // 4, BATCH // 4 - 2
BODY: dict[str, Any] = {
    "input_prefix": "def add(a, b):\n    return ",
    "input_suffix": "\n\nprint(add(1, 2))\n",
    "n_predict": 4,
    "temperature": 0,
}


@pytest.fixture(scope="module")
def fim_server(tmp_path_factory: pytest.TempPathFactory, fim_gguf: Path) -> Iterator[ServerProcess]:
    """A tiny random-weight GGUF with StarCoder's FIM tokens, from the benchmark builder."""
    yield from serving(
        tmp_path_factory,
        "fim",
        "-m",
        str(fim_gguf),
        "--ctx-size",
        str(CTX),
        "--batch-size",
        str(BATCH),
    )


@pytest.fixture(scope="module")
def fim_http(fim_server: ServerProcess) -> Iterator[httpx.Client]:
    with fim_server.http() as client:
        yield client


def _infill(http: httpx.Client, **body: Any) -> dict[str, Any]:
    response = http.post("/infill", json={**BODY, **body})
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def _count(http: httpx.Client, text: str) -> int:
    tokens: list[int] = http.post("/tokenize", json={"content": text}).json()["tokens"]
    return len(tokens)


@slow
def test_infill_prompt_is_the_repo_level_fim_layout(fim_http: httpx.Client) -> None:
    extra = [{"filename": "util.py", "text": "X = 1\n"}, {"text": "Y = 2\n"}]
    answer = _infill(fim_http, input_extra=extra, prompt="a")
    expected = (
        "<repo_name>myproject\n<file_sep>util.py\nX = 1\n<file_sep>tmp\nY = 2\n"
        "<file_sep>filename\n<fim_prefix>def add(a, b):\n    return a<fim_suffix>\n\n"
        "print(add(1, 2))\n<fim_middle>"
    )
    assert answer["prompt"] == expected
    # Each piece is tokenized on its own, then the FIM tokens (one each) join them.
    pieces = ["myproject\n", "util.py\n", "X = 1\n", "tmp\n", "Y = 2\n", "filename\n", "a"]
    pieces += [BODY["input_prefix"], BODY["input_suffix"]]
    fim_tokens = 7  # [REP], three [SEP], [PRE], [SUF], [MID]
    counted = sum(_count(fim_http, piece) for piece in pieces) + fim_tokens
    assert answer["tokens_evaluated"] == counted
    assert answer["stop"] is True and answer["tokens_predicted"] == 4
    again = _infill(fim_http, input_extra=extra, prompt="a")
    assert again["content"] == answer["content"]


@slow
@pytest.mark.parametrize(
    ("n_predict", "extra_room"),
    [(4, CTX - BATCH - 2 * 4), (-1, CTX - 1 - (PREFIX_ROOM + SUFFIX_ROOM + 3))],
)
def test_long_inputs_are_cut_as_llama_server_cuts_them(
    fim_http: httpx.Client, n_predict: int, extra_room: int
) -> None:
    prefix = "".join(f"p{i} = {i}\n" for i in range(200))
    suffix = "".join(f"s{i} = {i}\n" for i in range(100))
    extra = [{"filename": "big.py", "text": "".join(f"e{i} = {i}\n" for i in range(400))}]
    answer = _infill(
        fim_http, input_prefix=prefix, input_suffix=suffix, input_extra=extra, n_predict=n_predict
    )
    prompt = answer["prompt"]
    # The prefix keeps its end, the suffix its start, the extra files their end.
    head, rest = prompt.split("<fim_prefix>")
    kept_prefix, rest = rest.split("<fim_suffix>")
    kept_suffix = rest.removesuffix("<fim_middle>")
    assert prefix.endswith(kept_prefix) and len(kept_prefix) < len(prefix)
    assert suffix.startswith(kept_suffix) and len(kept_suffix) < len(suffix)
    assert head.endswith("<file_sep>filename\n") and not head.startswith("<repo_name>")
    assert _count(fim_http, kept_prefix) in (PREFIX_ROOM - 1, PREFIX_ROOM, PREFIX_ROOM + 1)
    assert answer["tokens_evaluated"] == PREFIX_ROOM + SUFFIX_ROOM + extra_room + 3


@slow
def test_streamed_infill_ends_with_the_final_object(fim_http: httpx.Client) -> None:
    response = fim_http.post("/infill", json={**BODY, "stream": True})
    assert response.status_code == 200
    frames = [f for f in response.text.split("\n\n") if f]
    assert "[DONE]" not in response.text
    assert frames[-1].startswith("data: ") and '"stop": true' in frames[-1]


@slow
def test_completions_suffix_is_the_same_fim_prompt(
    fim_server: ServerProcess, fim_http: httpx.Client
) -> None:
    infilled = _infill(fim_http)
    completion = fim_server.openai().completions.create(
        model="default",
        prompt=BODY["input_prefix"],
        suffix=BODY["input_suffix"],
        max_tokens=4,
        temperature=0,
    )
    assert completion.usage is not None
    assert completion.usage.prompt_tokens == infilled["tokens_evaluated"]
    assert completion.choices[0].text == infilled["content"]
    assert completion.usage.completion_tokens == 4


@slow
@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input_suffix": "x"}, "input_prefix"),
        ({**BODY, "input_extra": [{"filename": "a.py"}]}, "input_extra.0.text"),
        ({**BODY, "input_extra": "nope"}, "input_extra"),
    ],
)
def test_bad_infill_bodies_name_the_field(
    fim_http: httpx.Client, body: dict[str, Any], param: str
) -> None:
    response = fim_http.post("/infill", json=body)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == param


@slow
def test_a_model_without_fim_tokens_is_a_400(server: ServerProcess) -> None:
    with server.http() as http:
        infill = http.post("/infill", json=BODY)
        completion = http.post("/v1/completions", json={"prompt": "def f(", "suffix": ")"})
    for response, param in ((infill, "input_prefix"), (completion, "suffix")):
        assert response.status_code == 400
        error = response.json()["error"]
        assert error["code"] == "infill_not_supported" and error["param"] == param
        assert "Infill is not supported by this model" in error["message"]
        assert "prefix, suffix, middle" in error["message"]


def test_extra_files_without_fim_separators_are_snippets() -> None:
    options = LlamaCppOptions(ctx_size=512, threads=1, parallel=1, batch_size=128, ubatch_size=128)
    generator = LlamaCppGenerator(default_gguf(), options)
    try:
        fim = FimLayout(prefix=7, suffix=8, middle=9, repo=None, separator=None)

        def plain(text: str) -> list[int]:
            return generator.tokenize(text, add_special=False, parse_special=False)

        tokens = infill_prompt(
            generator, fim, plain("a = "), plain("\n"), files=[ExtraFile(text="b = 2\n")], prompt=[]
        )
        text = b"".join(generator.token_bytes(t, special=True) for t in tokens).decode()
        assert text == "\n\n--- snippet ---\n\nb = 2\n<gh_stars>a = <issue_start>\n<issue_comment>"
    finally:
        generator.close()
