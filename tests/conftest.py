"""Shared fixtures: the real server on the embedded default model, over TCP and a socket."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.server_process import ServerProcess, stop_the_stopping

# The tiny random-weight MLX models the tests build (tests/mlx_model.py).
LLAMA_DIR = "tiny-llama-0.1"
# Test files that share the images server (`images_server`), whose start is slow (torch and
# diffusers in each of its image workers): with --dist loadfile they go to one pytest worker as
# one unit, so that it starts once.
IMAGE_FILES = frozenset(
    {"tests/test_images.py", "tests/test_image_edits.py", "tests/test_image_queue.py"}
)


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """pytest-xdist's loadfile scheduling, the image files taken as one file."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class SharedServerScheduling(LoadFileScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            scope: str = super()._split_scope(nodeid)
            return "tests/test_image*.py" if scope in IMAGE_FILES else scope

    return SharedServerScheduling(config, log)


def start(tmp: Path, *args: str, ready_timeout: float = 120, **kwargs: object) -> ServerProcess:
    """Start a server, logging to a file under `tmp`, and wait until it is ready."""
    server = ServerProcess(*args, log_path=tmp / "server.log", **kwargs)  # type: ignore[arg-type]
    try:
        server.wait_ready(ready_timeout)
    except Exception:
        server.stop()
        raise
    return server


def serving(tmp: pytest.TempPathFactory, name: str, *args: str) -> Iterator[ServerProcess]:
    """A module-scoped fixture's server: started in its own folder, told to stop after the
    module (without waiting: see ServerProcess.stop_soon)."""
    proc = start(tmp.mktemp(name), *args)
    yield proc
    proc.stop_soon()


def on_each_engine(request: pytest.FixtureRequest, *args: str) -> ServerProcess:
    """A module's server for `request.param`: the default model on llama.cpp ("llamacpp"), or
    the tiny MLX Llama ("mlx", skipped without mlx-lm), with the server flags `args`."""
    tmp = request.getfixturevalue("tmp_path_factory").mktemp(request.param)
    if request.param == "mlx":
        pytest.importorskip("mlx_lm")
        models: Path = request.getfixturevalue("models")
        args = ("-m", str(models / LLAMA_DIR), "--backend", "mlx", *args)
    return start(tmp, *args)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Every server that `stop_soon` left exiting has exited."""
    stop_the_stopping()


def applied_prompt(server: ServerProcess, messages: list[dict[str, Any]], **body: Any) -> str:
    """The prompt that POST /apply-template makes of a chat request."""
    with server.http() as http:
        response = http.post("/apply-template", json={"messages": messages, **body})
    assert response.status_code == 200, response.text
    prompt: str = response.json()["prompt"]
    return prompt


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """`mlxcel serve` on the default model over TCP."""
    proc = start(tmp_path_factory.mktemp("tcp"), "--ctx-size", "2048")
    yield proc
    proc.stop()


@pytest.fixture(scope="session")
def client(server: ServerProcess) -> openai.OpenAI:
    """The official OpenAI client pointed at the TCP server."""
    return server.openai()


@pytest.fixture(scope="session")
def built_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder for the run's digest-named builds of bench/models.py and its kin, one for
    all pytest workers: a model is built once a run (write_once renames a build whole, so a
    worker never sees another's half-written file)."""
    base = tmp_path_factory.getbasetemp()
    return (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "built-models"


@pytest.fixture(scope="session")
def tiny_gguf(built_models: Path) -> Path:
    """bench/models.py's random-weight GGUF, SmolLM2's vocabulary and all, cut to two layers:
    built once for every test file that loads it."""
    from bench.models import SHAPES, build, tiny

    return build(tiny(SHAPES["smollm2-135m"]), built_models).path


@pytest.fixture(scope="session")
def fim_gguf(built_models: Path) -> Path:
    """tiny_gguf's shape with StarCoder's FIM tokens where SmolLM2 has others."""
    from bench.models import SHAPES, build, tiny

    return build(tiny(SHAPES["smollm2-135m"]), built_models, fim=True).path


@pytest.fixture(scope="session")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with tiny random-weight MLX models: a Llama and a Qwen3."""
    from tests.mlx_model import build_model

    root = tmp_path_factory.mktemp("mlx-models")
    build_model(root / LLAMA_DIR, "llama")
    build_model(root / "tiny-qwen3", "qwen3", seed=1)
    return root


@pytest.fixture(scope="session")
def image_pipeline(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random-weight Stable Diffusion pipeline folder (bench/image_model.py)."""
    from bench.image_model import build_pipeline

    return build_pipeline(tmp_path_factory.mktemp("image-models") / "tiny-sd")


IMAGE_KEY = "image-key"
# Seconds an image server may take to start: torch and diffusers import slowly on a busy CPU.
IMAGE_READY_S = 600
IMAGE_URL_TTL_S = 4


# The images server's second pipeline: room for one request waiting, for two seconds at most.
BUSY_IMAGE_MODEL = "tiny-sd-busy"
BUSY_QUEUE_TIMEOUT_S = 2
# Its third: the same weights as a single-file checkpoint in a folder of configs only.
SINGLE_FILE_IMAGE_MODEL = "tiny-sd-file"


@pytest.fixture(scope="session")
def images_server(
    tmp_path_factory: pytest.TempPathFactory, image_pipeline: Path
) -> Iterator[ServerProcess]:
    """From an mlx-openai-server style --config: the default chat model, the tiny pipeline
    as `tiny-sd`, again as `tiny-sd-busy` with a short queue, and as a single-file checkpoint
    (`tiny-sd-file`); behind an API key."""
    from bench.sd_single_file import single_file_pipeline

    from mlxcel.weights import default_model_path

    folder = tmp_path_factory.mktemp("images")
    checkpoint = single_file_pipeline(image_pipeline, folder / "tiny-sd-configs")
    image = {"model_path": str(image_pipeline), "threads": 1}
    config = {
        "server": {"api_key": IMAGE_KEY, "image_url_ttl": IMAGE_URL_TTL_S},
        "models": [
            {"model_path": str(default_model_path()), "context_length": 512, "threads": 1},
            {**image, "model_type": "image-generation", "served_model_name": "tiny-sd"},
            {
                **image,
                "model_type": "image-edit",
                "served_model_name": BUSY_IMAGE_MODEL,
                "queue_size": 1,
                "queue_timeout": BUSY_QUEUE_TIMEOUT_S,
            },
            {
                "model_path": str(checkpoint),
                "threads": 1,
                "model_type": "image-generation",
                "served_model_name": SINGLE_FILE_IMAGE_MODEL,
            },
        ],
    }
    (folder / "models.yaml").write_text(json.dumps(config))
    proc = start(folder, "--config", str(folder / "models.yaml"), ready_timeout=IMAGE_READY_S)
    yield proc
    proc.stop()


@pytest.fixture(scope="session")
def images_client(images_server: ServerProcess) -> openai.OpenAI:
    """The OpenAI client on the images server."""
    return openai.OpenAI(base_url=images_server.base_url, api_key=IMAGE_KEY, max_retries=0)


@pytest.fixture
def http(server: ServerProcess) -> Iterator[httpx.Client]:
    """An httpx client on the TCP server, for the bodies the SDK does not send."""
    with server.http() as client:
        yield client


def ok(response: httpx.Response) -> Any:
    """The JSON of a response that must be a 200."""
    assert response.status_code == 200, response.text
    return response.json()
