"""The transformers backend (torch): Hugging Face vision-language folders of the Qwen2-VL
family, for a machine where MLX runs on the CPU."""

try:
    import transformers  # noqa: F401
except ImportError as exc:
    raise ImportError(
        "serving a folder on transformers needs: pip install 'mlxcel[transformers]'"
    ) from exc

from mlxcel.backends.transformers.generator import TransformersOptions, TransformersVisionGenerator

__all__ = ["TransformersOptions", "TransformersVisionGenerator"]
