"""Structured outputs with llguidance: the tokens a request's JSON schema or grammar allows next.

Both engines use it for JSON schemas (the whole of JSON Schema, bounds and lengths included);
MLX also for GBNF grammars, which llama.cpp enforces with its own grammar sampler.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import llguidance
import llguidance.numpy
import numpy as np
from llguidance.gbnf_to_lark import any_to_lark as gbnf_to_lark

from mlxcel.engine.markers import marked_literals, with_markers
from mlxcel.engine.types import EngineError, SamplingParams

logger = logging.getLogger(__name__)


def held_by_guidance(params: SamplingParams) -> bool:
    """Whether llguidance holds the request's constraint on llama.cpp: a JSON schema, a lark
    grammar, or a GBNF grammar with markers (llama.cpp's grammar sampler matches a marker by
    its text, so a model could spell a special token out piece by piece: on a random model
    it did, which its own vocabulary never would)."""
    if params.json_schema is not None or params.grammar_syntax == "lark":
        return True
    return params.grammar is not None and bool(params.grammar_markers)


def _special_token(tokenizer: llguidance.LLTokenizer) -> Callable[[str], int | None]:
    """The one special token a text is in `tokenizer`'s vocabulary, if it is one."""

    def token(text: str) -> int | None:
        tokens = tokenizer.tokenize_str(text, parse_special=True)
        if len(tokens) == 1 and tokenizer.is_special_token(tokens[0]):
            return tokens[0]
        return None

    return token


def _grammar(params: SamplingParams, tokenizer: llguidance.LLTokenizer) -> str:
    """llguidance's grammar for the request's GBNF or lark grammar, else its JSON schema."""
    if params.grammar is not None:
        text, syntax = params.grammar, params.grammar_syntax
        markers = params.grammar_markers
        try:
            if markers and syntax == "gbnf":
                text, syntax = marked_literals(gbnf_to_lark(text), markers), "lark"
            if markers:
                text = with_markers(text, markers, _special_token(tokenizer))
            return llguidance.grammar_from(syntax, text)
        except ValueError as exc:
            raise EngineError(f"the grammar does not parse: {exc}", "invalid_grammar") from exc
    try:
        # JSON as the llama.cpp engine's schema converter writes it: at most one space between
        # tokens, so a model cannot spend its budget on whitespace ("x-guidance" may override).
        return llguidance.LLMatcher.grammar_from_json_schema(
            params.json_schema or "{}", defaults={"whitespace_pattern": " ?"}
        )
    except ValueError as exc:
        raise EngineError(
            f"cannot constrain to this JSON schema: {exc}", "invalid_grammar"
        ) from exc


class Constraint:
    """One generation's grammar state: the tokens allowed next, advanced token by token.

    It starts at the first generated token, whatever prompt prefix the slot reuses.
    """

    def __init__(self, matcher: llguidance.LLMatcher, tokenizer_size: int, n_vocab: int) -> None:
        self._matcher = matcher
        self._bitmask = llguidance.numpy.allocate_token_bitmask(1, tokenizer_size)
        self._n_vocab = n_vocab

    @property
    def finished(self) -> bool:
        """Whether the grammar allows nothing more but ending (also after an error)."""
        return self._matcher.is_stopped()

    def allowed(self) -> np.ndarray:
        """Which of the model's `n_vocab` tokens may come next, as a bool vector.

        End-of-generation tokens are allowed only where the grammar accepts; tokens the model
        has beyond the tokenizer's (padding) never are.
        """
        llguidance.numpy.fill_next_token_bitmask(self._matcher, self._bitmask)
        # Bit i of 32-bit word w stands for token 32 * w + i: little-endian bytes, low bit first.
        bits = np.unpackbits(self._bitmask.view(np.uint8), count=self._n_vocab, bitorder="little")
        return bits.view(np.bool_)

    def advance(self, token: int) -> None:
        """Move past a sampled token; one the grammar rejects leaves it finished."""
        if not self._matcher.consume_token(token):
            logger.warning("the grammar rejected token %d: %s", token, self._matcher.get_error())


def constraint(
    params: SamplingParams, tokenizer: llguidance.LLTokenizer, n_vocab: int
) -> Constraint:
    """The request's grammar or schema, ready at its start; an invalid one is `invalid_grammar`."""
    matcher = llguidance.LLMatcher(tokenizer, _grammar(params, tokenizer), log_level=0)
    if matcher.is_error():
        field = "grammar" if params.grammar is not None else "JSON schema"
        raise EngineError(
            f"cannot constrain to this {field}: {matcher.get_error()}", "invalid_grammar"
        )
    return Constraint(matcher, tokenizer.vocab_size, n_vocab)
