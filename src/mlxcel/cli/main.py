"""`mlxcel serve` and `mlxcel-server`: llama-server style flags."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import mlxcel
from mlxcel.cli.arguments import serve_arguments
from mlxcel.cli.audio import audio_config
from mlxcel.cli.distributed import distributed_config, serve_other_rank, with_split
from mlxcel.cli.encoders import encoder_config
from mlxcel.cli.hub import add_hub_commands, run_hub
from mlxcel.cli.launch import launch_arguments, launch_argv
from mlxcel.cli.llama_server import check_llama_server_arguments
from mlxcel.cli.lora import check_lora_arguments, lora_adapters
from mlxcel.cli.media import media_policy
from mlxcel.cli.models import SIDE_MODELS, fail, file_models, side_models
from mlxcel.cli.realtime import realtime_config
from mlxcel.cli.replicas import check_replica_arguments, replica_fields
from mlxcel.cli.rpc import check_rpc_arguments, rpc_server_arguments, run_rpc_server
from mlxcel.cli.security import check_api_keys, security_settings
from mlxcel.config import settings as defaults
from mlxcel.config.file import (
    ConfigError,
    read_config,
)
from mlxcel.config.settings import ModelConfig, ServerConfig
from mlxcel.config.values import parse_origins
from mlxcel.logs import configure
from mlxcel.weights import WeightsError, hub_id, is_vision_folder, resolve_model

logger = logging.getLogger("mlxcel.cli")

_SERVER_FLAGS = (
    "ray_address",
    "ray_start_timeout",
    "host",
    "port",
    "socket",
    "log_level",
    "max_memory",
    "image_url_ttl",
    "image_url_max_mib",
    "image_max_pixels",
    "image_max_steps",
)


# The checked numeric flags for which 0 means something (no limit, no timeout, off).
_MAY_BE_ZERO = ("ctx_size", "queue_size", "queue_timeout", "shutdown_timeout", "worker_timeout")


def _api_keys(args: argparse.Namespace) -> tuple[str, ...]:
    keys = list(args.api_key)
    if args.api_key_file is not None:
        keys += args.api_key_file.read_text().splitlines()
    keys += os.environ.get(defaults.API_KEY_ENV, "").split(",")
    return tuple(dict.fromkeys(k.strip() for k in keys if k.strip()))


def _check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    check_lora_arguments(parser, args)
    for name in (
        "ctx_size",
        "threads",
        "parallel",
        "batch_size",
        "ubatch_size",
        "queue_size",
        "queue_timeout",
        "shutdown_timeout",
        "worker_timeout",
    ):
        minimum = 0 if name in _MAY_BE_ZERO else 1
        if getattr(args, name) < minimum:
            parser.error(f"--{name.replace('_', '-')} must be at least {minimum}")
    if args.threads_batch is not None and args.threads_batch < 1:
        parser.error("--threads-batch must be at least 1")
    if not 0 < args.port < 65536:
        parser.error("--port must be between 1 and 65535")
    ollama_port = getattr(args, "ollama_port", None)
    if ollama_port is not None and not (0 < ollama_port < 65536 and ollama_port != args.port):
        parser.error("--ollama-port must be between 1 and 65535, and not --port")
    if args.cache_ram < -1:
        parser.error("--cache-ram must be -1 (no limit), 0 (off) or a size in MiB")
    if args.chat_template_file is not None and not args.chat_template_file.is_file():
        parser.error(f"--chat-template-file {args.chat_template_file}: no such file")
    if args.p_less and args.p_less_norm:
        parser.error("set either --p-less or --p-less-norm, not both")
    check_llama_server_arguments(parser, args)
    check_rpc_arguments(parser, args)
    check_replica_arguments(parser, args)


def _model_flags(args: argparse.Namespace) -> ModelConfig:
    """The per-model settings the flags give (the model itself is filled in later)."""
    return ModelConfig(
        model=Path(),
        backend=args.backend,
        ctx_size=args.ctx_size,
        n_predict=args.n_predict,
        threads=args.threads,
        threads_batch=args.threads_batch,
        parallel=args.parallel,
        batch_size=args.batch_size,
        ubatch_size=args.ubatch_size,
        queue_size=args.queue_size,
        queue_timeout=args.queue_timeout,
        warmup=not args.no_warmup,
        tool_call_parser=args.tool_call_parser,
        reasoning_parser=args.reasoning_parser,
        chat_template_file=args.chat_template_file,
        cache_ram_mib=args.cache_ram,
        cache_disk=args.cache_disk,
        cache_disk_max=args.cache_disk_max,
        slot_save_path=args.slot_save_path,
        temperature=args.temp,
        top_p=args.top_p,
        top_k=args.top_k,
        min_p=args.min_p,
        repeat_penalty=args.repeat_penalty,
        p_less=args.p_less,
        p_less_norm=args.p_less_norm,
        seed=None if args.seed == -1 else args.seed,
        reasoning=args.reasoning,
        chat_template=args.chat_template,
        chat_template_kwargs=json.loads(args.chat_template_kwargs or "{}"),
        jinja=args.jinja,
        n_gpu_layers=args.n_gpu_layers,
        rpc=args.rpc,
        tensor_split=args.tensor_split,
        rpc_key_file=args.rpc_key_file,
        flash_attn=args.flash_attn,
        mmap=args.mmap,
        mlock=args.mlock,
        mmproj=args.mmproj,
        embedding_batch_tokens=args.embedding_batch_tokens,
        embedding_engine=args.embedding_engine,
        cache_type_k=args.cache_type_k,
        cache_type_v=args.cache_type_v,
        spec_type=args.spec_type,
        spec_ngram_size_n=args.spec_ngram_simple_size_n,
        draft_max=args.draft_max,
        draft_min=args.draft_min,
        draft_cost=args.draft_cost,
        model_draft=args.model_draft,
        **replica_fields(args),
    )


def _flag_models(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[ModelConfig]:
    """-m's model (the embedded default without one) and the side models."""
    from mlxcel.config.engines import choose_backend

    side = side_models(parser, args, _model_flags(args))
    try:
        model = resolve_model(args.model)
        choose_backend(model, args.backend)
    except (WeightsError, ValueError, OSError) as exc:
        fail(parser, str(exc))
    main = replace(
        _model_flags(args),
        distributed=distributed_config(parser, args)[0],
        model=model,
        alias=args.alias,
        tags=args.tags,
        hub_id=hub_id(args.model),
        lora_adapters=lora_adapters(parser, args),
        lora_init_without_apply=args.lora_init_without_apply,
    )
    if is_vision_folder(model):
        # A folder with a vision tower is served as the vision model it is, as a config file's
        # `kind: vision` would.
        main = replace(main, kind="vision")
    return [main, *side]


def _config(parser: argparse.ArgumentParser, args: argparse.Namespace) -> ServerConfig:
    _check(parser, args)
    try:
        api_keys = _api_keys(args)
    except OSError as exc:
        fail(parser, str(exc))
    server: dict[str, object] = {}
    if args.config is None:
        models = _flag_models(parser, args)
    else:
        given = [f"--{d.replace('_', '-')}" for d in ("model", *SIDE_MODELS) if getattr(args, d)]
        if given:
            fail(parser, f"--config lists the models; {', '.join(given)} cannot be given with it")
        try:
            file = read_config(args.config)
        except ConfigError as exc:
            fail(parser, str(exc))
        models = file_models(parser, file, _model_flags(args))
        server = dict(file.server)
        api_keys = tuple(dict.fromkeys((*api_keys, *server.pop("api_keys", ()))))  # type: ignore[misc]
        for item in file.ignored:
            logger.warning("%s: accepted, not acted on yet", item)
    models = [with_split(parser, m) for m in models]
    check_api_keys(parser, api_keys)
    if args.api_key:
        logger.warning(
            "--api-key puts the key in the command line, which every user of this machine can "
            "read (ps, /proc/PID/cmdline); give it with --api-key-file FILE or $%s instead",
            defaults.API_KEY_ENV,
        )
    # A server flag given on the command line wins over the file's server section.
    for dest in _SERVER_FLAGS:
        if dest not in server or getattr(args, dest) != parser.get_default(dest):
            server[dest] = getattr(args, dest)
    verbose = server["log_level"] == "debug"
    return ServerConfig(
        models=tuple(replace(m, verbose=verbose) for m in models),
        api_keys=api_keys,
        config_file=args.config,
        log_format=args.log_format,
        webui=not args.no_webui,
        strict_model_names=args.strict_model_names,
        ollama_port=getattr(args, "ollama_port", None),
        shutdown_timeout=args.shutdown_timeout,
        worker_timeout=args.worker_timeout,
        exit_on_stdin_close=args.exit_on_stdin_close,
        remove_socket_dir=args.remove_socket_dir,
        cors_origins=parse_origins(args.cors_origins) if args.cors_origins else (),
        media=media_policy(args),
        **encoder_config(parser, args),
        **audio_config(parser, args),
        **realtime_config(parser, args),
        **security_settings(args),
        **server,  # type: ignore[arg-type]
    )


def _run_server(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    configure(args.log_level, args.log_format)
    group, rank = distributed_config(parser, args)
    if group is not None and args.config is not None:
        fail(parser, "--distributed splits -m's model; in --config, give a model `distributed:`")
    if group is not None and rank > 0:
        return serve_other_rank(group, rank)
    config = _config(parser, args)
    logging.getLogger().setLevel(config.log_level.upper())
    if config.ray_address is not None:
        from mlxcel.models.ray_cluster import RayUnreachable, connect

        try:
            connect(config.ray_address, config.ray_start_timeout)
        except RayUnreachable as exc:
            print(f"mlxcel: {exc}", file=sys.stderr)
            return 2
    from mlxcel.api.server import serve

    return serve(config)


def _add_version(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--version", action="version", version=f"%(prog)s {mlxcel.__version__}")


def main(argv: Sequence[str] | None = None) -> int:
    """`mlxcel COMMAND`."""
    parser = argparse.ArgumentParser(prog="mlxcel", description="Local OpenAI-compatible server")
    _add_version(parser)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve = commands.add_parser(
        "serve", help="start the server", description="Start the OpenAI-compatible server."
    )
    serve_arguments(serve)
    launch = commands.add_parser(
        "launch",
        help="start the server with mlx-openai-server's `launch` flags",
        description="Start the server, taking mlx-openai-server's `launch` flags.",
    )
    launch_arguments(launch)
    rpc_server = commands.add_parser(
        "rpc-server",
        help="lend this machine's devices to a GGUF model served elsewhere (serve --rpc)",
        description="ggml's RPC server, from the build that serves the model.",
    )
    rpc_server_arguments(rpc_server)
    add_hub_commands(commands)
    args, unknown = parser.parse_known_args(argv)
    if args.command in ("pull", "list", "rm"):
        if unknown:
            parser.error(f"unrecognized arguments: {' '.join(unknown)}")
        return run_hub(parser, args)
    if unknown:
        # Said by the subcommand, so a typo in one of its flags shows its usage, not ours.
        {"launch": launch, "rpc-server": rpc_server}.get(args.command, serve).error(
            f"unrecognized arguments: {' '.join(unknown)}"
        )
    if args.command == "rpc-server":
        return run_rpc_server(rpc_server, args)
    if args.command == "launch":
        return _run_server(serve, serve.parse_args(launch_argv(launch, args)))
    return _run_server(serve, args)


def server_main(argv: Sequence[str] | None = None) -> int:
    """`mlxcel-server`: the same as `mlxcel serve`."""
    parser = argparse.ArgumentParser(
        prog="mlxcel-server", description="Start the OpenAI-compatible server."
    )
    _add_version(parser)
    serve_arguments(parser)
    return _run_server(parser, parser.parse_args(argv))
