"""The llama.cpp backend (llama-cpp-python): GGUF models."""

from mlxcel.backends.llamacpp.generator import LlamaCppGenerator
from mlxcel.backends.llamacpp.model import LlamaCppOptions

__all__ = ["LlamaCppGenerator", "LlamaCppOptions"]
