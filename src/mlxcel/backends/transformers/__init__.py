"""The transformers backend (torch): Hugging Face vision-language folders of the Qwen2-VL
family, for a machine where MLX runs on the CPU."""

from mlxcel.extras import install_extra

try:
    import transformers  # noqa: F401
except ImportError as exc:
    raise ImportError(
        "serving a folder on transformers needs: " + install_extra("transformers")
    ) from exc

from mlxcel.backends.transformers.generator import TransformersOptions, TransformersVisionGenerator

__all__ = ["TransformersOptions", "TransformersVisionGenerator"]
