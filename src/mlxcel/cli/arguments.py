"""The flags of `mlxcel serve`: llama-server's names, with mlxcel's own beside them."""

from __future__ import annotations

import argparse
from pathlib import Path

from mlxcel.cli.audio import audio_arguments
from mlxcel.cli.distributed import distributed_arguments
from mlxcel.cli.encoders import encoder_arguments
from mlxcel.cli.llama_server import llama_server_arguments
from mlxcel.cli.lora import lora_arguments
from mlxcel.cli.media import media_arguments
from mlxcel.cli.models import SIDE_MODELS, add_image_url_flags
from mlxcel.cli.realtime import realtime_arguments
from mlxcel.cli.rpc import rpc_arguments
from mlxcel.cli.security import security_arguments
from mlxcel.config import settings as defaults
from mlxcel.config.cores import default_threads
from mlxcel.config.values import names, parse_size
from mlxcel.logs import LOG_FORMATS, LOG_LEVELS
from mlxcel.parsers.reasoning import PARSERS as REASONING_PARSERS
from mlxcel.parsers.tools import PARSERS


def serve_arguments(parser: argparse.ArgumentParser) -> None:
    """Every flag of `mlxcel serve` and `mlxcel-server`."""
    add = parser.add_argument
    add(
        "-m",
        "--model",
        metavar="PATH",
        help="GGUF file, MLX or Hugging Face model directory, or hub id like org/name "
        "(default: the embedded SmolLM2-135M-Instruct)",
    )
    add(
        "-a",
        "--alias",
        metavar="NAME[,NAME]",
        help="served model names, comma-separated; the first is its id (default: the file stem)",
    )
    add(
        "--tags",
        type=names,
        default=(),
        metavar="TAG[,TAG]",
        help="labels listed with the model in /v1/models (llama-server's; not used for routing)",
    )
    add(
        "--config",
        type=Path,
        metavar="FILE",
        help="YAML file with a server: section and a models: list (mlx-openai-server's "
        "files load as they are); replaces -m and the side-model flags",
    )
    for dest, kind in SIDE_MODELS.items():
        add(
            f"--{dest.replace('_', '-')}",
            metavar="MODEL",
            help=f"also serve this {defaults.KIND_NAMES[kind]} model: a path, a hub id or default",
        )
    add(
        "--backend",
        choices=defaults.BACKENDS,
        default=defaults.DEFAULT_BACKEND,
        help="engine: auto is llama.cpp for a .gguf file and MLX for a model directory or "
        "hub id; transformers serves a Hugging Face vision-language folder (Qwen2-VL, "
        "Qwen2.5-VL) on torch (default: %(default)s)",
    )
    add(
        "--host",
        default=defaults.DEFAULT_HOST,
        metavar="HOST[,HOST]",
        help="address to listen on, or several with commas (127.0.0.1,::1) (default: %(default)s)",
    )
    add(
        "--port",
        type=int,
        default=defaults.DEFAULT_PORT,
        help="TCP port to listen on (default: %(default)s)",
    )
    add(
        "--ollama-port",
        type=int,
        metavar="PORT",
        help="also listen on this TCP port (Ollama's is 11434), for clients with Ollama's "
        "address built in; every route answers on both (default: none)",
    )
    add(
        "--socket",
        metavar="PATH",
        type=Path,
        help="listen on this Unix domain socket (mode 0600) instead of TCP",
    )
    add(
        "--api-key",
        action="append",
        default=[],
        metavar="KEY",
        help="require this API key; repeatable. Every user of the machine can read it in the "
        f"process list: prefer --api-key-file or ${defaults.API_KEY_ENV} (comma-separated)",
    )
    add(
        "--api-key-file",
        type=Path,
        metavar="FILE",
        help="file with one API key per line (kept out of the process list, unlike --api-key)",
    )
    add(
        "-c",
        "--ctx-size",
        type=int,
        default=defaults.DEFAULT_CTX_SIZE,
        metavar="N",
        help="context size in tokens, shared by the parallel slots; 0 = the model's own "
        "(default: %(default)s)",
    )
    add(
        "-n",
        "--n-predict",
        type=int,
        default=defaults.DEFAULT_N_PREDICT,
        metavar="N",
        help="max tokens when a request sets none; -1 = until the context is full "
        "(default: %(default)s)",
    )
    add(
        "-t",
        "--threads",
        type=int,
        default=default_threads(),
        metavar="N",
        help="CPU threads for generation (default: %(default)s, the physical cores)",
    )
    add(
        "-tb",
        "--threads-batch",
        type=int,
        metavar="N",
        help="CPU threads for prompt evaluation (default: as many as --threads)",
    )
    add(
        "-np",
        "--parallel",
        type=int,
        default=defaults.DEFAULT_PARALLEL,
        metavar="N",
        help="sequences decoded together (default: %(default)s)",
    )
    add(
        "-b",
        "--batch-size",
        type=int,
        default=defaults.DEFAULT_BATCH_SIZE,
        metavar="N",
        help="most prompt tokens evaluated per step (default: %(default)s)",
    )
    add(
        "--queue-size",
        type=int,
        default=defaults.DEFAULT_QUEUE_SIZE,
        metavar="N",
        help="requests that may wait for a slot before new ones get 503 (default: %(default)s)",
    )
    add(
        "-ub",
        "--ubatch-size",
        type=int,
        default=defaults.DEFAULT_UBATCH_SIZE,
        metavar="N",
        help="physical batch: most tokens per forward pass (default: %(default)s)",
    )
    add(
        "--tool-call-parser",
        choices=["auto", *PARSERS],
        default="auto",
        help="how tool calls are read from output; auto follows the chat template "
        "(default: %(default)s)",
    )
    add(
        "--reasoning-parser",
        choices=["auto", "none", *REASONING_PARSERS, "harmony"],
        default="auto",
        help="how thinking is split from answers; auto reads the template's <think> tags or "
        "channel markup "
        "(default: %(default)s)",
    )
    add(
        "-cram",
        "--cache-ram",
        type=int,
        default=defaults.DEFAULT_CACHE_RAM_MIB,
        metavar="MiB",
        help="host memory for prompt KV state that slots give up, reused by later requests "
        "that share its prefix; -1 = no limit, 0 = off (default: %(default)s)",
    )
    add(
        "--cache-disk",
        type=Path,
        metavar="DIR",
        help="keep prompt KV state on disk under DIR too: what leaves the RAM cache, and every "
        "state when the model unloads or the server stops, for later requests and restarts "
        "(default: off)",
    )
    add(
        "--cache-disk-max",
        type=_memory_size,
        default=defaults.DEFAULT_CACHE_DISK_MAX,
        metavar="SIZE",
        help="disk the prompt cache may use per model (bytes, 512M, 8G); least recently used "
        f"states leave first (default: {defaults.DEFAULT_CACHE_DISK_MAX >> 30}G)",
    )
    add(
        "--slot-save-path",
        type=Path,
        metavar="DIR",
        help="where POST /slots/{id}?action=save|restore writes and reads slot files "
        "(default: slot actions off)",
    )
    add(
        "--chat-template-file",
        type=Path,
        metavar="FILE",
        help="Jinja chat template to use instead of the model's own",
    )
    add(
        "--queue-timeout",
        type=float,
        default=defaults.DEFAULT_QUEUE_TIMEOUT,
        metavar="S",
        help="seconds a request may wait for a slot before it gets 503; 0 = no limit "
        "(default: %(default)s)",
    )
    add(
        "--temp",
        type=float,
        metavar="T",
        help="temperature when a request sets none (default: the model's, else 0.8)",
    )
    add(
        "--top-p",
        type=float,
        metavar="P",
        help="top_p when a request sets none (default: the model's, else 0.95)",
    )
    add(
        "--top-k",
        type=int,
        metavar="K",
        help="top_k when a request sets none; 0 disables (default: the model's, else 40)",
    )
    add(
        "--min-p",
        type=float,
        metavar="P",
        help="min_p when a request sets none (default: the model's, else 0.05)",
    )
    add(
        "--repeat-penalty",
        type=float,
        metavar="X",
        help="repeat penalty when a request sets none (default: the model's, else 1.0)",
    )
    add(
        "--p-less",
        action="store_true",
        help="p-less sampling for requests that set neither p_less nor p_less_norm",
    )
    add(
        "--p-less-norm",
        action="store_true",
        help="normalised p-less sampling for requests that set neither p_less nor p_less_norm",
    )
    add(
        "--max-memory",
        type=_memory_size,
        metavar="SIZE",
        help="memory the loaded models may hold together (bytes, 512M, 8G, or a percentage "
        "of RAM like 50%%); idle models are unloaded to make room, least recently used first "
        "(default: no limit)",
    )
    add(
        "--shutdown-timeout",
        type=float,
        default=defaults.DEFAULT_SHUTDOWN_TIMEOUT,
        metavar="S",
        help="on SIGTERM or SIGINT, seconds the requests in flight may take to finish before "
        "they end with an error (default: %(default)s)",
    )
    add(
        "--worker-timeout",
        type=float,
        default=defaults.DEFAULT_WORKER_TIMEOUT,
        metavar="S",
        help="seconds a loaded model's worker process may go without answering its heartbeat "
        "(stopped or wedged) before it is killed, its requests fail with 503 and the model "
        "restarts on its next request; 0: never (default: %(default)s)",
    )
    add(
        "--exit-on-stdin-close",
        action="store_true",
        help="shut down when standard input reaches end of file (the Python client's managed "
        "server follows its parent process so)",
    )
    add(
        "--remove-socket-dir",
        action="store_true",
        help="at exit, remove the --socket file's directory too if it is then empty (the Python "
        "client's private temporary one, which a parent killed with SIGKILL cannot remove)",
    )
    add_image_url_flags(add)
    add("--no-warmup", action="store_true", help="skip the warm-up run after loading")
    add("--no-webui", action="store_true", help="do not serve the browser playground at /")
    add(
        "--log-level",
        choices=LOG_LEVELS,
        default=defaults.DEFAULT_LOG_LEVEL,
        help="log verbosity (default: %(default)s)",
    )
    add(
        "--log-format",
        choices=LOG_FORMATS,
        default=LOG_FORMATS[0],
        help="text lines, or one JSON object per line for log shippers (default: %(default)s)",
    )
    llama_server_arguments(parser)
    rpc_arguments(parser)
    lora_arguments(parser)
    encoder_arguments(parser)
    audio_arguments(parser)
    realtime_arguments(parser)
    media_arguments(parser)
    security_arguments(parser)
    distributed_arguments(parser)


def _memory_size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
