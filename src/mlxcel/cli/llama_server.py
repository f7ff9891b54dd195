"""`mlxcel serve` flags as llama-server users type them, and the checks argparse cannot make."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from mlxcel.chat_templates import BUILTIN_TEMPLATES
from mlxcel.config import settings as defaults
from mlxcel.config import values as to
from mlxcel.config.settings import (
    DEFAULT_KV_CACHE_TYPE,
    KV_CACHE_TYPES,
    kv_cache_problem,
)
from mlxcel.config.values import parse_origins

# A --chat-template value that is one word: a built-in template's name, not Jinja text.
_WORD = re.compile(r"^[\w.-]+$")
# llama.cpp's spellings of on, off and auto (common/arg.cpp).
_SWITCH = {
    **dict.fromkeys(("on", "enabled", "true", "1"), "on"),
    **dict.fromkeys(("off", "disabled", "false", "0"), "off"),
    **dict.fromkeys(("auto", "-1"), "auto"),
}


def _switch(value: str) -> str:
    try:
        return _SWITCH[value.lower()]
    except KeyError:
        raise argparse.ArgumentTypeError(f"'{value}' is not on, off or auto") from None


def _gpu_layers(value: str) -> int:
    if value.lower() in ("auto", "all"):
        return -1
    try:
        layers = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{value}' is not a number, auto or all") from None
    if layers < -1:
        raise argparse.ArgumentTypeError("must be -1 (all), 0 or more")
    return layers


def _draft_cost(value: str) -> float | None:
    try:
        return to.draft_cost(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def llama_server_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags as llama-server users type them: names, CORS, seed, templates, offload."""
    add = parser.add_argument
    add(
        "--strict-model-names",
        action="store_true",
        help="404 for a request naming a model not served, instead of serving it with the "
        "one model there is",
    )
    add(
        "--cors-origins",
        metavar="ORIGIN[,ORIGIN]",
        help="let browser apps on these origins (http://app:3000, a host name for any of its "
        "ports, 'localhost' for this machine's, or '*' for any) call the server; off by default "
        "(API keys still apply)",
    )
    add(
        "-s",
        "--seed",
        type=int,
        default=-1,
        metavar="N",
        help="seed for requests that set none; -1 = a random one each (default: %(default)s)",
    )
    add(
        "-rea",
        "--reasoning",
        type=_switch,
        default="auto",
        metavar="on|off|auto",
        help="enable_thinking for chat templates when a request does not set it; auto and on "
        "pass true, off false (default: %(default)s)",
    )
    add(
        "--chat-template",
        metavar="NAME|JINJA",
        help="a built-in template by llama-server's name "
        f"({', '.join(sorted(BUILTIN_TEMPLATES))}), or Jinja template text",
    )
    add(
        "--chat-template-kwargs",
        metavar="JSON",
        help="a JSON object of variables for the chat template, under the request's own",
    )
    add(
        "--jinja",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="render the model's Jinja template; --no-jinja uses the built-in template of the "
        "model's format instead, as llama-server does (default: jinja)",
    )
    add(
        "-ngl",
        "--gpu-layers",
        "--n-gpu-layers",
        dest="n_gpu_layers",
        type=_gpu_layers,
        metavar="N|auto|all",
        help="llama.cpp: layers to offload to the GPU (default: llama.cpp's, all on a GPU build)",
    )
    add(
        "-fa",
        "--flash-attn",
        type=_switch,
        nargs="?",
        const="on",
        default="auto",
        metavar="on|off|auto",
        help="llama.cpp: flash attention (default: %(default)s)",
    )
    add(
        "--mmap",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="llama.cpp: memory-map the weights; --no-mmap reads them in (default: mmap)",
    )
    add("--mlock", action="store_true", help="llama.cpp: keep the weights in RAM (no swapping)")
    for short, part in (("-ctk", "k"), ("-ctv", "v")):
        add(
            short,
            f"--cache-type-{part}",
            choices=KV_CACHE_TYPES,
            default=DEFAULT_KV_CACHE_TYPE,
            metavar="TYPE",
            help=f"llama.cpp: KV cache data type for {part.upper()}, one of "
            f"{', '.join(KV_CACHE_TYPES)}; q8_0 halves the cache, q4_0 quarters it"
            + (" (a quantized V needs flash attention)" if part == "v" else "")
            + " (default: %(default)s)",
        )
    speculative_arguments(parser)


def speculative_arguments(parser: argparse.ArgumentParser) -> None:
    """Speculative decoding flags, by llama-server's names (and its older ones)."""
    add = parser.add_argument
    add(
        "--spec-type",
        choices=defaults.SPEC_TYPES,
        default="none",
        help="llama.cpp: speculative decoding; ngram-simple drafts the tokens that followed the "
        "last n-gram where it occurred before in the prompt or output (prompt lookup), all "
        "verified in one batched pass (default: %(default)s)",
    )
    add(
        "-md",
        "--model-draft",
        type=Path,
        metavar="FILE",
        help="llama.cpp: a draft model GGUF of the model's vocabulary (a smaller model of its "
        "family): it drafts greedily, up to --draft-max tokens per step, for each sequence, "
        "all verified in the model's one batched pass",
    )
    add(
        "--spec-ngram-simple-size-n",
        type=int,
        default=defaults.DEFAULT_SPEC_NGRAM_SIZE_N,
        metavar="N",
        help="tokens of the n-gram looked up (default: %(default)s)",
    )
    add(
        "--spec-draft-n-max",
        "--draft-max",
        "--draft",
        "--draft-n",
        "--spec-ngram-simple-size-m",
        dest="draft_max",
        type=int,
        default=defaults.DEFAULT_DRAFT_MAX,
        metavar="N",
        help="most tokens drafted per step; the length adapts below it to what is accepted "
        "(default: %(default)s)",
    )
    add(
        "--spec-draft-n-min",
        "--draft-min",
        "--draft-n-min",
        dest="draft_min",
        type=int,
        default=defaults.DEFAULT_DRAFT_MIN,
        metavar="N",
        help="a shorter draft is not verified (default: %(default)s)",
    )
    add(
        "--draft-cost",
        type=_draft_cost,
        default=None,
        metavar="COST",
        help="what verifying a drafted token costs, as a share of a one-token decode, which "
        "n-gram drafts are sized by: auto (measured at load) or a number; 0 drafts whatever a "
        "lookup finds, as llama-server does (default: auto)",
    )


def check_llama_server_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """What argparse cannot check of those flags alone."""
    if args.alias is not None and not args.alias.replace(",", "").strip():
        parser.error("--alias needs at least one name")
    if args.seed < -1:
        parser.error("--seed must be -1 (random) or a seed")
    if args.chat_template is not None:
        if args.chat_template_file is not None:
            parser.error("set either --chat-template or --chat-template-file, not both")
        # Any text is Jinja (one with no tags renders as itself, as llama-server takes it); a
        # lone word that names no built-in template is a misspelt name.
        if args.chat_template not in BUILTIN_TEMPLATES and _WORD.match(args.chat_template):
            names = ", ".join(sorted(BUILTIN_TEMPLATES))
            parser.error(
                f"--chat-template '{args.chat_template}': not a template ({names}) or Jinja"
            )
    if args.chat_template_kwargs is not None:
        try:
            kwargs = json.loads(args.chat_template_kwargs)
        except ValueError as exc:
            parser.error(f"--chat-template-kwargs is not JSON: {exc}")
        if not isinstance(kwargs, dict):
            parser.error("--chat-template-kwargs must be a JSON object")
    if args.cors_origins is not None:
        try:
            parse_origins(args.cors_origins)
        except ValueError as exc:
            parser.error(str(exc))
    problem = kv_cache_problem(args.cache_type_v, args.flash_attn) or defaults.speculation_problem(
        args.spec_ngram_simple_size_n,
        args.draft_max,
        args.draft_min,
        args.model_draft,
        args.spec_type,
    )
    if problem is not None:
        parser.error(problem)
