"""Embedding and reranking model folders on ONNX Runtime's CPU provider, measured ahead of
torch on a Linux CPU (bench/embeddings.py).

The folder loads as on torch; its transformer (a cross-encoder's whole classifier) is then
exported to ONNX once, cached by the weights it came from, and runs in onnxruntime. What comes
after the transformer in a sentence-transformers pipeline (pooling, dense layers) stays the
model's own torch modules, so the vectors are the torch engine's, to float rounding."""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
import warnings
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np

from mlxcel.backends.embeddings.torch_models import TorchEmbedder, TorchReranker

logger = logging.getLogger(__name__)

ENGINE = "onnxruntime"
CACHE_ENV = "MLXCEL_CACHE_DIR"
# Files whose change makes a cached export stale (the weights and how they are laid out).
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".json")


def cache_root() -> Path:
    """Where exported models are kept: $MLXCEL_CACHE_DIR, else the user cache folder."""
    given = os.environ.get(CACHE_ENV)
    if given:
        return Path(given).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "mlxcel"


def _export_key(folder: Path, part: str) -> str:
    """A digest of the folder's weights and configs and of the exporting versions (read from
    the packages' metadata: a reranker never imports sentence-transformers, whose import takes
    scikit-learn, scipy and pandas along)."""
    digest = hashlib.sha256()
    for name in (part, *(version(p) for p in ("torch", "transformers", "sentence-transformers"))):
        digest.update(name.encode() + b"\0")
    for file in sorted(folder.resolve().rglob("*")):
        if file.is_file() and file.suffix in _WEIGHT_SUFFIXES:
            stat = file.stat()
            digest.update(
                f"{file.relative_to(folder.resolve())}:{stat.st_size}:{stat.st_mtime_ns}\0".encode()
            )
    return digest.hexdigest()[:20]


class _Graph:
    """A torch module of named tensor inputs and one tensor output, for the exporter."""

    def __init__(self, module: Any, names: list[str], output: str | None) -> None:
        import torch

        class Wrapped(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.inner = module

            def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
                features = dict(zip(names, tensors, strict=True))
                if output is None:
                    return self.inner(**features).logits
                return self.inner(features)[output]

        self.module = Wrapped().eval()


Axes = dict[str, dict[int, str]]


def _export(module: Any, sample: dict[str, Any], target: Path, axes: Axes | None) -> None:
    """Trace `module` (a torch module of positional tensors) on `sample` into
    `target`/model.onnx, the batch and length dynamic unless `axes` says which are."""
    import torch

    names = list(sample)
    target.mkdir(parents=True)
    with warnings.catch_warnings(), torch.no_grad():
        # The tracer warns about shape checks that hold for every encoder input.
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module,
            tuple(sample[n] for n in names),
            str(target / "model.onnx"),
            input_names=names,
            output_names=["output"],
            dynamic_axes=axes or {n: {0: "batch", 1: "tokens"} for n in names},
            opset_version=17,
            dynamo=False,
        )


def cached_export(
    folder: Path, part: str, module: Any, sample: dict[str, Any], axes: Axes | None = None
) -> Path:
    """The ONNX file of `module` (a torch module), exported now unless an earlier load left it
    in the cache."""
    final = cache_root() / "onnx" / f"{folder.name}-{part}-{_export_key(folder, part)}"
    model = final / "model.onnx"
    if model.is_file():
        return model
    final.parent.mkdir(parents=True, exist_ok=True)
    logger.info("exporting %s to ONNX (once; kept in %s)", folder.name, final.parent)
    staging = Path(tempfile.mkdtemp(dir=final.parent, prefix=".export-"))
    try:
        _export(module, sample, staging / "graph", axes)
        # Another process may have finished the same export first: keep theirs.
        try:
            (staging / "graph").rename(final)
        except OSError:
            if not model.is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return model


def session_options(threads: int) -> Any:
    """ONNX Runtime's options for an encoder on `threads` cores.

    Its pool threads block between operators instead of spinning: a spinning thread holds a
    core the HTTP process (and the other models) need, and on a shared machine waits for one
    preempted peer at every operator: on 2 cores at load 9, a one-sentence forward took 23 ms
    instead of 190, a batch of 32 2.1 s instead of 2.7. bench/embeddings.py's in-process engine
    runs with the same options."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3
    return options


def session(model: Path, threads: int) -> Any:
    """An onnxruntime session of `model` on the CPU."""
    import onnxruntime as ort

    options = session_options(threads)
    return ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])


def _run(session: Any, features: dict[str, Any]) -> Any:
    """The session's output for torch `features`, as a torch tensor."""
    import torch

    feed = {name: features[name].numpy() for name in (i.name for i in session.get_inputs())}
    return torch.from_numpy(np.ascontiguousarray(session.run(None, feed)[0]))


class _OnnxTransformer:
    """A sentence-transformers pipeline's first module, run by onnxruntime."""

    def __init__(self, session: Any, output: str) -> None:
        self._session = session
        self._output = output

    def __call__(self, features: dict[str, Any]) -> dict[str, Any]:
        return {**features, self._output: _run(self._session, features)}


def _sample(engine: TorchEmbedder | TorchReranker, rows: list[list[int]]) -> dict[str, Any]:
    """Two padded inputs of different lengths to trace with."""
    return engine.features(sorted(rows, key=len, reverse=True))


class OnnxEmbedder(TorchEmbedder):
    """A sentence-transformers folder whose transformer runs in onnxruntime."""

    def __init__(self, path: Path, *, threads: int, batch_tokens: int) -> None:
        from dataclasses import replace

        super().__init__(path, threads=threads, batch_tokens=batch_tokens)
        transformer = self._modules[0]
        output = getattr(transformer, "module_output_name", "token_embeddings")
        if not hasattr(transformer, "auto_model"):
            raise ValueError(
                f"{path.name}: the onnxruntime engine runs transformer models; "
                "serve this one with --embedding-engine torch"
            )
        sample = _sample(self, self.tokenize(["a sentence to trace", "b"]))
        model = cached_export(
            path, "embed", _Graph(transformer, list(sample), output).module, sample
        )
        self._modules[0] = _OnnxTransformer(session(model, threads), output)
        self.info = replace(self.info, engine=ENGINE)


class OnnxReranker(TorchReranker):
    """A sequence-classification folder (a CrossEncoder) run by onnxruntime."""

    def __init__(self, path: Path, *, threads: int, batch_tokens: int) -> None:
        from dataclasses import replace

        super().__init__(path, threads=threads, batch_tokens=batch_tokens)
        sample = _sample(self, self.tokenize_pairs("a query to trace", ["a document", "b"]))
        model = cached_export(
            path, "rerank", _Graph(self._model, list(sample), None).module, sample
        )
        self._session = session(model, threads)
        del self._model
        self.info = replace(self.info, engine=ENGINE)

    def logits(self, features: dict[str, Any]) -> Any:
        """The exported classifier's logits."""
        return _run(self._session, features)

    def close(self) -> None:
        """Drop the session."""
        del self._session
