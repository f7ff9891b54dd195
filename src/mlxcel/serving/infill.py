"""Fill-in-the-middle prompts, laid out as llama-server lays them, from the model's FIM tokens.

    [FIM_REP]myproject\n[FIM_SEP]{filename}\n{text}...[FIM_SEP]filename\n
    [BOS][FIM_PRE]{prefix}{prompt}[FIM_SUF]{suffix}[FIM_MID]

A model without FIM_REP/FIM_SEP gets each extra file after a `--- snippet ---` line instead.
As in llama-server, prefix and suffix are cut to fit one batch (3:1, the prefix keeping its end
and the suffix its start) and the extra files fill what the context has left past a batch and
twice the answer's token limit, keeping their end; unlike llama-server, never past the context.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from mlxcel.engine.capabilities import FillsInTheMiddle
from mlxcel.engine.types import TextModel
from mlxcel.models.loaded import LoadedModel
from mlxcel.protocol.errors import invalid_request
from mlxcel.protocol.infill import ExtraFile, InfillRequest
from mlxcel.serving.native import NativeJob, native_job

# llama-server's placeholders for the project's and the current file's names.
PROJECT = "myproject\n"
CURRENT_FILE = "filename\n"
SNIPPET = "\n\n--- snippet ---\n\n"


@dataclass(frozen=True)
class FimLayout:
    """The FIM tokens a model has: the three a prompt needs, and the repository-level pair."""

    prefix: int
    suffix: int
    middle: int
    repo: int | None
    separator: int | None


def fim_layout(model: LoadedModel, param: str) -> FimLayout:
    """The model's FIM tokens, or a 400 naming `param` that says the model cannot infill."""
    generator = model.generator
    if not isinstance(generator, FillsInTheMiddle):
        raise invalid_request(
            f"Infill is not supported by this model: the {model.backend} engine does not read "
            "FIM tokens; serve a GGUF model that has them",
            param,
            "infill_not_supported",
        )
    fim = generator.fim_tokens
    named = {"prefix": fim.prefix, "suffix": fim.suffix, "middle": fim.middle}
    missing = ", ".join(name for name, token in named.items() if token is None)
    if fim.prefix is None or fim.suffix is None or fim.middle is None:
        raise invalid_request(
            f"Infill is not supported by this model: its vocabulary has no FIM tokens ({missing})",
            param,
            "infill_not_supported",
        )
    return FimLayout(fim.prefix, fim.suffix, fim.middle, fim.repo, fim.separator)


def _plain(generator: TextModel, text: str) -> list[int]:
    return generator.tokenize(text, add_special=False, parse_special=False)


def _extra_tokens(generator: TextModel, fim: FimLayout, files: Sequence[ExtraFile]) -> list[int]:
    tokens: list[int] = []
    if fim.repo is not None:
        tokens += [fim.repo, *_plain(generator, PROJECT)]
    for file in files:
        if fim.separator is not None:
            tokens += [fim.separator, *_plain(generator, file.filename + "\n")]
        else:
            tokens += _plain(generator, SNIPPET)
        tokens += _plain(generator, file.text)
    if fim.separator is not None:
        tokens += [fim.separator, *_plain(generator, CURRENT_FILE)]
    return tokens


def infill_prompt(
    generator: TextModel,
    fim: FimLayout,
    prefix: list[int],
    suffix: list[int],
    *,
    files: Sequence[ExtraFile] = (),
    prompt: Sequence[int] = (),
    limit: int = -1,
) -> list[int]:
    """The prompt tokens for a gap between `prefix` and `suffix` (llama-server's format_infill),
    for an answer of at most `limit` tokens (-1: no limit)."""
    n_batch, n_ctx = generator.max_feed_tokens, generator.n_ctx_seq
    extra = _extra_tokens(generator, fim, files)
    prefix_take = min(len(prefix), 3 * (n_batch // 4))
    suffix_take = min(len(suffix), max(0, n_batch // 4 - (2 + len(prompt))))
    head = [fim.prefix, *prefix[len(prefix) - prefix_take :], *prompt]
    if generator.add_bos:
        head = generator.tokenize("", add_special=True, parse_special=False)[:1] + head
    gap = [*head, fim.suffix, *suffix[:suffix_take], fim.middle]
    # llama-server's share for the extra files, cut so that one token of answer still fits.
    room = n_ctx - 1 - len(gap)
    extra_take = max(0, min(n_ctx - n_batch - 2 * limit, len(extra), room))
    return [*extra[len(extra) - extra_take :], *gap]


def answer_limit(token_limit: int | None, n_predict: int) -> int:
    """The answer's token limit: the request's, else the server's -n (-1: none)."""
    return n_predict if token_limit is None else token_limit


def prepare_infill(model: LoadedModel, request: InfillRequest, n_predict: int) -> NativeJob:
    """POST /infill: the FIM prompt, then a /completion-shaped generation of it."""
    fim = fim_layout(model, "input_prefix")
    generator = model.generator
    tokens = infill_prompt(
        generator,
        fim,
        _plain(generator, request.input_prefix),
        _plain(generator, request.input_suffix),
        files=request.input_extra,
        prompt=generator.tokenize(request.prompt, add_special=False, parse_special=True),
        limit=answer_limit(request.token_limit(), n_predict),
    )
    return native_job(model, request, [tokens], n_predict)
