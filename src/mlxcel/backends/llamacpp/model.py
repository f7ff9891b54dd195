"""Loading a GGUF on llama.cpp: the options, the context parameters, and what the model file
says about itself (sampling defaults, chat template, infill tokens)."""

from __future__ import annotations

import ctypes
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import llama_cpp

from mlxcel.backends.llamacpp import native, rpc
from mlxcel.backends.llamacpp.kv_cache import ggml_type
from mlxcel.engine.capabilities import DeviceInfo, FimTokens
from mlxcel.engine.types import ChatTemplate

logger = logging.getLogger(__name__)


# GGUF's recommended sampling (general.sampling.*) under our names.
_GGUF_SAMPLING_KEYS = {
    "temp": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "penalty_repeat": "repeat_penalty",
    "penalty_last_n": "repeat_last_n",
}


@dataclass(frozen=True)
class LlamaCppOptions:
    """How to load a GGUF model."""

    ctx_size: int
    threads: int
    parallel: int
    batch_size: int
    ubatch_size: int
    verbose: bool = False
    n_gpu_layers: int | None = None
    """Layers to offload to a GPU; None: llama.cpp's default (all of them, where one is)."""
    flash_attn: str = "auto"
    """Flash attention: on, off or auto."""
    mmap: bool = True
    mlock: bool = False
    mmproj: Path | None = None
    """A vision projector GGUF (--mmproj): the model then reads images."""
    threads_batch: int | None = None
    """Threads for prompt evaluation; None: `threads`."""
    cache_type_k: str = "f16"
    """KV cache data type of K (kv_cache.KV_TYPES); f16 is llama.cpp's default."""
    cache_type_v: str = "f16"
    """Of V; a quantized V needs flash attention."""
    model_draft: Path | None = None
    """A draft model GGUF of the same vocabulary (-md): it drafts for speculative decoding."""
    rpc: tuple[tuple[str, str], ...] = ()
    """RPC servers to spread the layers over: (ggml endpoint, the host as the user named it)."""
    tensor_split: tuple[float, ...] = ()
    """Each device's share of the layers (--tensor-split); empty: by free memory."""


# How --mmap/--no-mmap and --mlock load the weights; mmap alone is llama.cpp's own choice.
_LOAD_MODES = {
    (True, False): llama_cpp.LLAMA_LOAD_MODE_AUTO,
    (True, True): llama_cpp.LLAMA_LOAD_MODE_MMAP_MLOCK,
    (False, True): llama_cpp.LLAMA_LOAD_MODE_MLOCK,
    (False, False): llama_cpp.LLAMA_LOAD_MODE_NONE,
}
_FLASH_ATTN = {
    "auto": llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO,
    "on": llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED,
    "off": llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED,
}


def model_params(options: LlamaCppOptions, devices: rpc.ModelDevices | None = None) -> Any:
    """llama.cpp's model parameters for these options (on `devices` where given)."""
    params = llama_cpp.llama_model_default_params()
    if options.n_gpu_layers is not None:
        params.n_gpu_layers = options.n_gpu_layers
    params.load_mode = _LOAD_MODES[options.mmap, options.mlock]
    if devices is not None:
        params.devices = ctypes.cast(devices.array, ctypes.c_void_p).value
    if options.tensor_split:
        if len(options.tensor_split) > llama_cpp.LLAMA_MAX_DEVICES:
            raise ValueError(f"--tensor-split: at most {llama_cpp.LLAMA_MAX_DEVICES} shares")
        shares = (ctypes.c_float * llama_cpp.LLAMA_MAX_DEVICES)(*options.tensor_split)
        params.tensor_split = shares  # the structure keeps the array alive
    return params


def load_model(path: Path, options: LlamaCppOptions) -> tuple[Any, tuple[DeviceInfo, ...]]:
    """The model loaded (onto its RPC servers too), and the devices its layers went to."""
    devices = None
    if options.rpc:
        native.always_release_gil()
        devices = rpc.model_devices(options.rpc)
    with rpc.layer_split() as counts:
        model = llama_cpp.llama_model_load_from_file(
            str(path).encode(), model_params(options, devices)
        )
    if model is None:
        raise ValueError(f"llama.cpp could not load {path}: not a valid GGUF model?")
    return model, rpc.devices_report(devices, counts)


def new_context(model: Any, options: LlamaCppOptions) -> Any:
    """A context over the model with these options; frees the model when none can be made."""
    params = llama_cpp.llama_context_default_params()
    params.n_ctx = options.ctx_size
    params.n_batch = options.batch_size
    params.n_ubatch = min(options.ubatch_size, options.batch_size)
    params.n_seq_max = options.parallel
    params.n_threads = options.threads
    params.n_threads_batch = options.threads_batch or options.threads
    params.no_perf = True
    params.flash_attn_type = _FLASH_ATTN[options.flash_attn]
    params.type_k = ggml_type(options.cache_type_k)
    params.type_v = ggml_type(options.cache_type_v)
    ctx = llama_cpp.llama_init_from_model(model, params)
    if ctx is None:
        llama_cpp.llama_model_free(model)
        raise ValueError(
            "llama.cpp could not create a context (context size too large, or a KV cache "
            "type this model or build does not support?)"
        )
    return ctx


def read_generation_config(model: Any) -> dict[str, float]:
    """The GGUF's recommended sampling (general.sampling.*), under our names."""
    config: dict[str, float] = {}
    for key, name in _GGUF_SAMPLING_KEYS.items():
        value = native.metadata_string(model, f"general.sampling.{key}")
        if value is not None:
            try:
                config[name] = float(value)
            except ValueError:
                logger.warning("ignoring GGUF general.sampling.%s=%r", key, value)
    return config


def read_fim_tokens(vocab: Any) -> FimTokens:
    """What llama.cpp found: the GGUF's tokenizer.ggml.fim_* ids, else known token texts."""

    def token(find: Any) -> int | None:
        found = int(find(vocab))
        return None if found == llama_cpp.LLAMA_TOKEN_NULL else found

    return FimTokens(
        prefix=token(llama_cpp.llama_vocab_fim_pre),
        suffix=token(llama_cpp.llama_vocab_fim_suf),
        middle=token(llama_cpp.llama_vocab_fim_mid),
        repo=token(llama_cpp.llama_vocab_fim_rep),
        separator=token(llama_cpp.llama_vocab_fim_sep),
    )


def read_chat_template(model: Any, vocab: Any) -> ChatTemplate | None:
    """The GGUF's chat template with the vocabulary's BOS and EOS texts, if it has one."""
    source = native.metadata_string(model, "tokenizer.chat_template")
    if source is None:
        return None
    bos = llama_cpp.llama_vocab_bos(vocab)
    eos = llama_cpp.llama_vocab_eos(vocab)
    return ChatTemplate(
        source=source,
        bos_token=native.token_piece(vocab, bos, special=True).decode(errors="replace"),
        eos_token=native.token_piece(vocab, eos, special=True).decode(errors="replace"),
    )
