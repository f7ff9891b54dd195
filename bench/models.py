"""Random-weight GGUF models in real models' shapes, built offline for the benchmark.

    python bench/models.py --shape smollm2-135m|qwen2.5-0.5b|qwen2-vl-2b --out DIR [--fim]

Writes the named architecture and shape with seeded random weights (normal * 0.02, norms 1)
as F16 through gguf-py, then quantizes it to Q4_0 with llama.cpp's own `llama_model_quantize`,
so each tensor gets the type a real Q4_0 file of that model has (the tied embedding Q8_0).
The tokenizer is the embedded default model's (SmolLM2); a larger vocabulary is padded with
tokens that detokenize to text; `--fim` gives it a code model's fill-in-the-middle tokens.
A file already built is reused: its name carries a digest of the shape, seed and tokens.
Prints the path; build time and size go to stderr.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import os
import sys
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Literal

import numpy as np
from gguf import GGUFReader, GGUFValueType, GGUFWriter, Keys, LlamaFileType, TokenType

WEIGHT_STD = 0.02
CACHE_DIR = Path(__file__).resolve().parent / ".cache"
TOKENS_KEY = "tokenizer.ggml.tokens"
TYPES_KEY = "tokenizer.ggml.token_type"
# With fim, four control tokens SmolLM2 never writes become StarCoder's FIM tokens, declared
# with its repository and file markers under the keys llama.cpp reads: (id, text) by key.
# SmolLM2's ids 3-16 are control tokens no template uses (<repo_name> ... <empty_output>).
SPECIALS_AT = 3
FIM_TOKENS = {
    Keys.Tokenizer.FIM_PRE_ID: (7, "<fim_prefix>"),
    Keys.Tokenizer.FIM_SUF_ID: (8, "<fim_suffix>"),
    Keys.Tokenizer.FIM_MID_ID: (9, "<fim_middle>"),
    Keys.Tokenizer.FIM_PAD_ID: (10, "<fim_pad>"),
    Keys.Tokenizer.FIM_REP_ID: (3, "<repo_name>"),
    Keys.Tokenizer.FIM_SEP_ID: (5, "<file_sep>"),
}


@dataclass(frozen=True)
class Shape:
    """A decoder-only transformer's architecture and dimensions, as llama.cpp names them."""

    name: str
    arch: Literal["llama", "qwen2", "qwen2vl"]  # qwen2 adds q/k/v biases; qwen2vl M-RoPE
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    rope_theta: float
    context: int
    rms_eps: float

    @property
    def head_dim(self) -> int:
        """Width of one attention head."""
        return self.hidden // self.heads

    @property
    def rope_sections(self) -> list[int]:
        """M-RoPE's rotary pairs per position section (temporal, row, column, unused), in
        Qwen2-VL's proportions (16, 24, 24, 0 of a 128-wide head)."""
        temporal = self.head_dim // 8
        spatial = (self.head_dim // 2 - temporal) // 2
        return [temporal, spatial, spatial, 0]


# From the models' own config.json (HuggingFaceTB/SmolLM2-135M, Qwen/Qwen2.5-0.5B,
# Qwen/Qwen2-VL-2B-Instruct); all tie the output projection to the token embedding, so no
# file has an output.weight.
SHAPES = {
    "smollm2-135m": Shape(
        name="smollm2-135m",
        arch="llama",
        layers=30,
        hidden=576,
        heads=9,
        kv_heads=3,
        ffn=1536,
        vocab=49152,
        rope_theta=100000.0,
        context=8192,
        rms_eps=1e-5,
    ),
    "qwen2.5-0.5b": Shape(
        name="qwen2.5-0.5b",
        arch="qwen2",
        layers=24,
        hidden=896,
        heads=14,
        kv_heads=2,
        ffn=4864,
        vocab=151936,
        rope_theta=1000000.0,
        context=32768,
        rms_eps=1e-6,
    ),
    "qwen2-vl-2b": Shape(
        name="qwen2-vl-2b",
        arch="qwen2vl",
        layers=28,
        hidden=1536,
        heads=12,
        kv_heads=2,
        ffn=8960,
        vocab=151936,
        rope_theta=1000000.0,
        context=32768,
        rms_eps=1e-6,
    ),
}


def tiny(shape: Shape) -> Shape:
    """A shape cut down for tests, vocabulary and all else kept: the same builder writes it."""
    return replace(
        shape, name=f"tiny-{shape.arch}", layers=2, hidden=64, heads=4, kv_heads=2, ffn=128
    )


@dataclass(frozen=True)
class Built:
    """A model file and what it cost; `seconds` is None when it came from the cache."""

    path: Path
    size_bytes: int
    seconds: float | None

    def summary(self) -> str:
        """Size, and build time or "cached"."""
        how = "cached" if self.seconds is None else f"built in {self.seconds:.1f} s"
        return f"{self.size_bytes / 2**20:.1f} MiB, {how}"


def tensor_shapes(shape: Shape) -> Iterator[tuple[str, tuple[int, ...]]]:
    """Every tensor's GGUF name and numpy shape (rows = outputs), in file order."""
    kv = shape.kv_heads * shape.head_dim
    yield "token_embd.weight", (shape.vocab, shape.hidden)
    for i in range(shape.layers):
        block = f"blk.{i}"
        yield f"{block}.attn_norm.weight", (shape.hidden,)
        for part, rows in (("q", shape.hidden), ("k", kv), ("v", kv)):
            yield f"{block}.attn_{part}.weight", (rows, shape.hidden)
            if shape.arch in ("qwen2", "qwen2vl"):
                yield f"{block}.attn_{part}.bias", (rows,)
        yield f"{block}.attn_output.weight", (shape.hidden, shape.hidden)
        yield f"{block}.ffn_norm.weight", (shape.hidden,)
        yield f"{block}.ffn_gate.weight", (shape.ffn, shape.hidden)
        yield f"{block}.ffn_up.weight", (shape.ffn, shape.hidden)
        yield f"{block}.ffn_down.weight", (shape.hidden, shape.ffn)
    yield "output_norm.weight", (shape.hidden,)


def seeded_normal(name: str, dims: tuple[int, ...], seed: int) -> np.ndarray:
    """F32 normal * WEIGHT_STD, seeded per tensor name: one tensor's values do not depend on
    the others."""
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    return rng.standard_normal(dims, dtype=np.float32) * np.float32(WEIGHT_STD)


def random_tensor(name: str, dims: tuple[int, ...], seed: int) -> np.ndarray:
    """Norm weights are ones (F32), biases small (F32), matrices normal * WEIGHT_STD (F16)."""
    if name.endswith("norm.weight"):
        return np.ones(dims, dtype=np.float32)
    values = seeded_normal(name, dims, seed)
    return values if len(dims) == 1 else values.astype(np.float16)


def digest(*key: object) -> str:
    """A short digest of what a cached file was built from, for its name."""
    return hashlib.sha256(repr(key).encode()).hexdigest()[:10]


def write_once(path: Path, write: Callable[[Path], None]) -> float | None:
    """Run `write` into a temporary file and rename it to `path`, unless `path` exists;
    the seconds it took, or None when cached. Named for this process and renamed when
    whole: an interrupted build never looks cached, and two builds never share a file."""
    if path.is_file():
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    partial = path.with_name(f"{path.stem}.{os.getpid()}.tmp")
    try:
        write(partial)
        partial.replace(path)
    finally:
        partial.unlink(missing_ok=True)
    return time.perf_counter() - began


def add_tokenizer(
    writer: GGUFWriter,
    source: Path,
    vocab: int,
    *,
    fim: bool = False,
    specials: tuple[str, ...] = (),
) -> None:
    """Copy every `tokenizer.*` key of `source`, padding the vocabulary up to `vocab` tokens;
    with `fim`, rename and declare the FIM tokens; `specials` rename SmolLM2's special tokens
    from SPECIALS_AT on (a family's markers, each one control token as in its own vocabulary)."""
    reader = GGUFReader(source)
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        value = field.contents()
        if key in (TOKENS_KEY, TYPES_KEY) and vocab < len(value):
            raise ValueError(f"{source.name} has {len(value)} tokens, more than {vocab}")
        # Real Qwen files mark padding tokens UNUSED, which detokenize to nothing; random
        # weights sample them often, and a benchmark that times streamed text would lose them.
        if key == TOKENS_KEY:
            value = value + [f"[PAD{i}]" for i in range(len(value), vocab)]
            if fim:
                for token, text in FIM_TOKENS.values():
                    value[token] = text
            value[SPECIALS_AT : SPECIALS_AT + len(specials)] = specials
        elif key == TYPES_KEY:
            value = value + [int(TokenType.NORMAL)] * (vocab - len(value))
        array = field.types[0] == GGUFValueType.ARRAY
        writer.add_key_value(
            key, value, field.types[0], sub_type=field.types[-1] if array else None
        )
    if fim:
        for fim_key, (token, _) in FIM_TOKENS.items():
            writer.add_uint32(fim_key, token)


def add_hparams(writer: GGUFWriter, shape: Shape) -> None:
    """The architecture's hyperparameters, under the keys llama.cpp reads."""
    writer.add_name(f"random {shape.name}")
    writer.add_context_length(shape.context)
    writer.add_embedding_length(shape.hidden)
    writer.add_block_count(shape.layers)
    writer.add_feed_forward_length(shape.ffn)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_rope_freq_base(shape.rope_theta)
    writer.add_rope_dimension_count(shape.head_dim)
    if shape.arch == "qwen2vl":
        writer.add_rope_dimension_sections(shape.rope_sections)
    writer.add_layer_norm_rms_eps(shape.rms_eps)
    writer.add_vocab_size(shape.vocab)
    writer.add_file_type(LlamaFileType.MOSTLY_F16)


def write_f16(
    shape: Shape,
    path: Path,
    tokenizer: Path,
    seed: int,
    *,
    fim: bool = False,
    specials: tuple[str, ...] = (),
) -> None:
    """The whole model at F16 (norms and biases F32), one tensor in memory at a time."""
    writer = GGUFWriter(path, shape.arch)
    add_hparams(writer, shape)
    add_tokenizer(writer, tokenizer, shape.vocab, fim=fim, specials=specials)
    for name, dims in tensor_shapes(shape):
        dtype = np.dtype(np.float32 if len(dims) == 1 else np.float16)
        writer.add_tensor_info(name, dims, dtype, int(np.prod(dims)) * dtype.itemsize)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for name, dims in tensor_shapes(shape):
        writer.write_tensor_data(random_tensor(name, dims, seed))
    writer.close()


def quantize_q4_0(source: Path, dest: Path) -> None:
    """llama.cpp's own Q4_0 quantization of a GGUF, with its per-tensor type choices."""
    import llama_cpp
    from llama_cpp import _logger as llama_logger

    llama_logger.set_verbose(False)
    llama_cpp.llama_backend_init()
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0
    params.nthread = os.cpu_count() or 1
    if llama_cpp.llama_model_quantize(
        str(source).encode(), str(dest).encode(), ctypes.byref(params)
    ):
        raise RuntimeError(f"llama_model_quantize failed on {source}")


def model_path(
    shape: Shape, out_dir: Path, seed: int, *, fim: bool = False, specials: tuple[str, ...] = ()
) -> Path:
    """Where this shape, seed and vocabulary are cached: a digest of them in the name."""
    key: tuple[object, ...] = (asdict(shape), seed, WEIGHT_STD)
    if fim:
        key = (*key, FIM_TOKENS)
    if specials:
        key = (*key, specials)
    return out_dir / f"random-{shape.name}-{digest(*key)}-q4_0.gguf"


def build(
    shape: Shape,
    out_dir: Path,
    seed: int = 0,
    *,
    fim: bool = False,
    specials: tuple[str, ...] = (),
) -> Built:
    """The Q4_0 GGUF for `shape`, built unless `out_dir` already holds it."""
    from mlxcel.weights import default_model_path

    path = model_path(shape, out_dir, seed, fim=fim, specials=specials)

    def write(partial: Path) -> None:
        f16 = partial.with_suffix(".f16.tmp")
        try:
            write_f16(shape, f16, default_model_path(), seed, fim=fim, specials=specials)
            quantize_q4_0(f16, partial)
        finally:
            f16.unlink(missing_ok=True)

    seconds = write_once(path, write)
    return Built(path, path.stat().st_size, seconds)


def main() -> None:
    """Build (or find) one shape's model and print its path."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), required=True)
    parser.add_argument("--out", type=Path, default=CACHE_DIR)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fim", action="store_true", help="with fill-in-the-middle tokens")
    args = parser.parse_args()
    built = build(SHAPES[args.shape], args.out, args.seed, fim=args.fim)
    print(f"{built.path.name}: {built.summary()}", file=sys.stderr)
    print(built.path)


if __name__ == "__main__":
    main()
