"""The MLX backend (mlx-lm): MLX and Hugging Face safetensors models."""

from mlxcel.extras import install_extra

try:
    import mlx_lm  # noqa: F401
except ImportError as exc:
    raise ImportError(
        "serving a model directory needs the MLX backend: " + install_extra("mlx")
    ) from exc

from mlxcel.backends.mlx.generator import MlxGenerator, MlxOptions

__all__ = ["MlxGenerator", "MlxOptions"]
