"""The llama.cpp backend (llama-cpp-python): GGUF models."""

from mlxcel.backends.llamacpp.generator import LlamaCppGenerator, LlamaCppOptions

__all__ = ["LlamaCppGenerator", "LlamaCppOptions"]
