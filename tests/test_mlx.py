"""The MLX backend behind the same routes, on tiny random-weight models built offline.

Random weights speak no language: these tests check structure and behaviour, never words.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

pytest.importorskip("mlx_lm")

from mlx_lm.utils import load_tokenizer

import mlxcel
from mlxcel import weights
from mlxcel.backends.mlx.dry import Dry
from mlxcel.backends.mlx.vocab import Vocabulary
from tests._client_util import default_gguf
from tests.conftest import LLAMA_DIR, serving, start
from tests.media_util import data_uri, image_bytes
from tests.server_process import MLXCEL, ServerProcess

pytestmark = pytest.mark.slow

HUB_ID = "tiny-org/tiny-qwen3"
STORY = [{"role": "user", "content": "Tell me a story about a cat."}]
# Greedy and to the limit, so two requests are comparable token for token.
FIXED = {"temperature": 0, "extra_body": {"ignore_eos": True}}


@pytest.fixture(scope="module")
def mlx_server(models: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    yield from serving(
        tmp_path_factory,
        "mlx",
        *("-m", str(models / LLAMA_DIR), "--backend", "mlx", "--parallel", "2", "-c", "2048"),
    )


@pytest.fixture(scope="module")
def client(mlx_server: ServerProcess) -> openai.OpenAI:
    return mlx_server.openai()


def token_id(server: ServerProcess, text: str) -> int:
    with server.http() as http:
        return int(http.post("/tokenize", json={"content": text}).json()["tokens"][-1])


def chat(client: openai.OpenAI, **kwargs: object) -> openai.types.chat.ChatCompletion:
    kwargs = {"model": "default", "messages": STORY, "max_tokens": 12, **kwargs}
    return client.chat.completions.create(**kwargs)  # type: ignore[call-overload, no-any-return]


def text_of(client: openai.OpenAI, **kwargs: object) -> str:
    return chat(client, **kwargs).choices[0].message.content or ""


def test_models_lists_the_directory_name(mlx_server: ServerProcess) -> None:
    with mlx_server.http() as http:
        model = http.get("/v1/models").json()["data"][0]
        props = http.get("/props").json()
    assert model["id"] == LLAMA_DIR
    assert model["meta"]["backend"] == "mlx"
    assert props["total_slots"] == 2
    assert "<|im_start|>" in props["chat_template"]


def test_chat_whole_and_streamed_agree(client: openai.OpenAI) -> None:
    whole = chat(client, **FIXED)
    assert whole.choices[0].finish_reason == "length"
    assert whole.usage is not None and whole.usage.completion_tokens == 12
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + 12
    chunks = list(chat(client, stream=True, stream_options={"include_usage": True}, **FIXED))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-2].choices[0].finish_reason == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 12
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content


def test_completions_whole_and_streamed_agree(client: openai.OpenAI) -> None:
    request = {"model": "default", "prompt": "The cat sat on", "max_tokens": 10, **FIXED}
    whole = client.completions.create(**request)  # type: ignore[call-overload]
    assert whole.object == "text_completion" and whole.choices[0].finish_reason == "length"
    chunks = list(client.completions.create(stream=True, **request))  # type: ignore[call-overload]
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text


def test_stop_string_across_a_token_boundary(client: openai.OpenAI) -> None:
    full = chat(client, max_tokens=30, logprobs=True, **FIXED)
    text = full.choices[0].message.content or ""
    pieces = [t.token for t in full.choices[0].logprobs.content]  # type: ignore[union-attr]
    stop = next(
        a[-1] + b[0]
        for a, b in itertools.pairwise(pieces)
        if a and b and a[-1] != " " and (a + b).isascii() and (a + b).isprintable()
    )
    cut = chat(client, max_tokens=30, stop=[stop], **FIXED)
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].message.content == text[: text.index(stop)]
    streamed = chat(client, max_tokens=30, stop=stop, stream=True, **FIXED)
    assert "".join(c.choices[0].delta.content or "" for c in streamed) == text[: text.index(stop)]


def test_seed_reproduces_and_n_gives_choices(client: openai.OpenAI) -> None:
    first = text_of(client, temperature=1.0, seed=1234, max_tokens=20)
    assert text_of(client, temperature=1.0, seed=1234, max_tokens=20) == first
    assert {text_of(client, temperature=1.0, seed=s, max_tokens=20) for s in (1, 2, 3)} != {first}
    # Two choices decode side by side in the two slots, each with its own random stream.
    both = chat(client, temperature=1.0, seed=1234, max_tokens=20, n=2)
    assert [c.index for c in both.choices] == [0, 1]
    assert both.choices[0].message.content == first
    assert both.choices[1].message.content != first


def test_penalties_dry_and_xtc_change_the_output(
    client: openai.OpenAI, mlx_server: ServerProcess
) -> None:
    plain = text_of(client, max_tokens=40, **FIXED)
    assert text_of(client, max_tokens=40, frequency_penalty=2.0, presence_penalty=2.0) != plain
    repeat = {"ignore_eos": True, "repeat_penalty": 1.8, "repeat_last_n": -1}
    assert text_of(client, max_tokens=40, temperature=0, extra_body=repeat) != plain
    # A forced token repeats itself; DRY's growing penalty ends the run.
    forced = {str(token_id(mlx_server, " cat")): 100}
    dry = {"dry_multiplier": 2.0, "dry_allowed_length": 1}
    assert text_of(client, max_tokens=20, temperature=0, logit_bias=forced) == " cat" * 20
    broken = text_of(client, max_tokens=20, temperature=0, logit_bias=forced, extra_body=dry)
    assert " cat" * 3 in broken and broken != " cat" * 20
    hot = {"temperature": 1.0, "seed": 4, "max_tokens": 20, "extra_body": {"top_k": 0}}
    xtc = {"top_k": 0, "xtc_probability": 1.0, "xtc_threshold": 0.01}
    assert text_of(client, **hot) != text_of(client, **{**hot, "extra_body": xtc})


def test_narrow_samplers_equal_greedy(client: openai.OpenAI) -> None:
    greedy = text_of(client, temperature=0)
    for knob in ({"top_k": 1}, {"min_p": 1.0}):
        assert text_of(client, temperature=1.5, extra_body=knob) == greedy, knob
    typical = {"typical_p": 0.001, "top_k": 0}
    outputs = {text_of(client, temperature=1.0, seed=s, extra_body=typical) for s in (1, 2)}
    assert len(outputs) == 1


def test_logprobs_shapes(client: openai.OpenAI) -> None:
    response = chat(client, max_tokens=8, logprobs=True, top_logprobs=3, **FIXED)
    content = response.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and len(content) == 8
    for entry in content:
        tops = [t.logprob for t in entry.top_logprobs]
        assert len(tops) == 3 and tops == sorted(tops, reverse=True)
        assert sum(math.exp(lp) for lp in tops) <= 1.0001
        assert entry.token == entry.top_logprobs[0].token
        assert math.isclose(entry.logprob, tops[0], abs_tol=1e-4)
    legacy = client.completions.create(
        model="default", prompt="The cat", max_tokens=5, logprobs=2, **FIXED
    )
    logprobs = legacy.choices[0].logprobs
    assert logprobs is not None and logprobs.tokens is not None
    assert len(logprobs.tokens) == len(logprobs.token_logprobs or []) == 5
    assert all(len(top) == 2 for top in logprobs.top_logprobs or [])


def test_post_sampling_probs_on_mlx(mlx_server: ServerProcess) -> None:
    """llama-server's post_sampling_probs on MLX too: the probabilities the sampler chain left
    (top_k 3: at most three, summing to 1), 1 for a greedy pick, and the same draw as
    without it for the same seed."""
    body = {"prompt": "The cat", "n_probs": 5, "n_predict": 4, "seed": 7, "temperature": 1.0}
    with mlx_server.http() as http:
        plain = http.post("/completion", json={**body, "top_k": 3}).json()
        post = http.post(
            "/completion", json={**body, "top_k": 3, "post_sampling_probs": True}
        ).json()
        greedy = http.post(
            "/completion", json={**body, "temperature": 0, "post_sampling_probs": True}
        ).json()
    assert post["tokens"] == plain["tokens"]
    for entry in post["completion_probabilities"]:
        probs = [t["prob"] for t in entry["top_probs"]]
        assert 0 < len(probs) <= 3 and sum(probs) == pytest.approx(1.0, abs=1e-4)
        assert entry["prob"] == pytest.approx(
            next(t["prob"] for t in entry["top_probs"] if t["id"] == entry["id"])
        )
    for entry in greedy["completion_probabilities"]:
        assert entry["prob"] == 1.0 and [t["prob"] for t in entry["top_probs"]] == [1.0]


def test_logit_bias_forces_and_bans(client: openai.OpenAI, mlx_server: ServerProcess) -> None:
    cat = token_id(mlx_server, " cat")
    assert text_of(client, max_tokens=4, temperature=0, logit_bias={str(cat): 100}) == " cat" * 4
    first = chat(client, max_tokens=1, logprobs=True, **FIXED).choices[0].logprobs
    banned = first.content[0].token  # type: ignore[union-attr, index]
    other = text_of(
        client, max_tokens=1, temperature=0, logit_bias={str(token_id(mlx_server, banned)): -100}
    )
    assert other != banned


def test_min_tokens_and_ignore_eos(client: openai.OpenAI, mlx_server: ServerProcess) -> None:
    eos = {str(token_id(mlx_server, "<|im_end|>")): 100}
    ended = chat(client, max_tokens=8, temperature=0, logit_bias=eos)
    assert ended.choices[0].finish_reason == "stop"
    assert ended.usage is not None and ended.usage.completion_tokens == 1
    held = chat(client, max_tokens=20, temperature=0, logit_bias=eos, extra_body={"min_tokens": 5})
    assert held.choices[0].finish_reason == "stop"
    assert held.usage is not None and held.usage.completion_tokens == 6
    ignored = chat(
        client, max_tokens=8, temperature=0, logit_bias=eos, extra_body={"ignore_eos": True}
    )
    assert ignored.choices[0].finish_reason == "length"


def test_a_text_mlx_model_refuses_images(client: openai.OpenAI) -> None:
    image = {"type": "image_url", "image_url": {"url": data_uri(image_bytes())}}
    with pytest.raises(openai.BadRequestError) as caught:
        chat(client, messages=[{"role": "user", "content": [image]}])
    assert caught.value.body == {
        "message": "model does not support image input",
        "type": "invalid_request_error",
        "param": "messages.0.content.0",
        "code": "unsupported_modality",
    }


def test_repeated_prompt_reuses_the_cached_prefix(client: openai.OpenAI) -> None:
    first = chat(client, **FIXED)
    again = chat(client, **FIXED)
    assert again.choices[0].message.content == first.choices[0].message.content
    details = again.usage.prompt_tokens_details  # type: ignore[union-attr]
    assert details is not None and (details.cached_tokens or 0) > 0


def test_prompt_longer_than_the_context(mlx_server: ServerProcess) -> None:
    with mlx_server.http() as http:
        response = http.post("/v1/completions", json={"prompt": "word " * 3000, "max_tokens": 1})
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "context_length_exceeded"


def test_disconnect_mid_stream_frees_the_engine(
    client: openai.OpenAI, mlx_server: ServerProcess
) -> None:
    tokens, cancelled = mlx_server.generation_counts()
    stream = client.completions.create(
        model="default", prompt="Once", max_tokens=1000, stream=True, **FIXED
    )
    for received, _ in enumerate(stream, start=1):
        if received == 3:
            break
    stream.close()
    mlx_server.assert_cancelled_early(tokens, cancelled, max_tokens=1000)
    for _ in range(3):
        assert chat(client, max_tokens=4).choices[0].message.content is not None


def _hub_cache(models: Path, root: Path) -> Path:
    """The Qwen3 model laid out as huggingface_hub caches `tiny-org/tiny-qwen3`."""
    repo = root / "hub" / f"models--{HUB_ID.replace('/', '--')}"
    commit = "0123456789abcdef0123456789abcdef01234567"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for file in (models / "tiny-qwen3").iterdir():
        (snapshot / file.name).write_bytes(file.read_bytes())
    return root / "hub"


def test_hub_id_resolves_offline_from_the_cache(models: Path, tmp_path: Path) -> None:
    hub = _hub_cache(models, tmp_path)
    env = {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(hub), "HF_HOME": str(tmp_path / "home")}
    server = start(tmp_path, "-m", HUB_ID, env=env)
    try:
        client = server.openai()
        assert client.models.list().data[0].id == HUB_ID
        assert text_of(client, model=HUB_ID, max_tokens=6, **FIXED)
    finally:
        server.stop()
    # MLX must clear its streams before exit, or the process aborts as it ends.
    assert "terminate called" not in server.log()
    missing = ServerProcess("-m", "tiny-org/absent", env=env, log_path=tmp_path / "absent.log")
    assert missing.process.wait(timeout=60) == 2
    missing.stop()
    # One short line that says what to do, not huggingface_hub's paragraph.
    error = missing.log().strip().splitlines()[-1]
    assert "tiny-org/absent is not in the Hugging Face cache" in error
    assert "hf download tiny-org/absent" in error


def test_backend_that_cannot_load_the_model_is_a_startup_error(
    models: Path, tmp_path: Path
) -> None:
    for args in (
        ("-m", str(models / LLAMA_DIR), "--backend", "llamacpp"),
        ("-m", str(default_gguf()), "--backend", "mlx"),
    ):
        proc = ServerProcess(*args, log_path=tmp_path / "log")
        assert proc.process.wait(timeout=60) == 2
        proc.stop()
        assert "--backend" in proc.log() and "cannot serve" in proc.log()


def test_managed_llm_on_a_model_directory(models: Path) -> None:
    with mlxcel.LLM(str(models / LLAMA_DIR), binary=MLXCEL, ctx_size=1024) as llm:
        assert llm.model == LLAMA_DIR
        assert llm.generate("Once upon a time", max_tokens=6, temperature=0)
        assert llm.chat(STORY, max_tokens=6, temperature=0, ignore_eos=True)
        assert len(list(llm.stream_chat(STORY, max_tokens=6, ignore_eos=True))) > 1
        assert llm.openai_client.models.list().data[0].id == LLAMA_DIR


def test_a_directory_that_fails_to_load_exits_cleanly(tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "llama"}')
    proc = ServerProcess("-m", str(broken), log_path=tmp_path / "log")
    assert proc.process.wait(timeout=60) == 2
    proc.stop()
    assert "could not load" in proc.log() and "terminate called" not in proc.log()


def test_hub_ids_and_model_directories_are_told_apart(tmp_path: Path) -> None:
    assert weights.hub_id("mlx-community/Qwen3-4B-4bit") == "mlx-community/Qwen3-4B-4bit"
    assert weights.hub_id(str(tmp_path)) is None
    assert weights.hub_id("models/absent.gguf") is None
    assert weights.hub_id("/abs/org/name") is None
    with pytest.raises(weights.WeightsError, match=r"no config\.json"):
        weights.resolve_model(str(tmp_path))


def test_token_bytes_spell_out_the_text(models: Path) -> None:
    vocab = Vocabulary(load_tokenizer(models / LLAMA_DIR))
    text = "Héllo wörld, the cat 🐱 sat.\n"
    ids = vocab.tokenize(text, add_special=True, parse_special=True)
    assert b"".join(vocab.token_bytes(t) for t in ids) == text.encode()
    end = vocab.tokenize("<|im_end|>", add_special=False, parse_special=True)
    assert len(end) == 1 and end[0] in vocab.end_of_generation
    assert vocab.token_bytes(end[0]) == b""
    assert vocab.token_bytes(end[0], special=True) == b"<|im_end|>"
    assert len(vocab.tokenize("<|im_end|>", add_special=False, parse_special=False)) > 1


def test_dry_penalises_the_token_that_extends_a_repeat() -> None:
    dry = Dry(multiplier=1.0, base=2.0, allowed_length=2, last_n=100, breakers=frozenset({9}))
    assert dry.penalties([1, 2, 3, 4, 1, 2, 3]) == {4: 2.0}
    assert dry.penalties([1, 2, 3, 9, 1, 2]) == {3: 1.0}
    assert dry.penalties([1, 2, 3, 1, 2, 9]) == {}
    assert dry.penalties([5, 5, 5, 5, 5]) == {5: 4.0}
