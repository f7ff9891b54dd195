"""The MLX backend (mlx-lm): MLX and Hugging Face safetensors models."""

try:
    import mlx_lm  # noqa: F401
except ImportError as exc:
    raise ImportError(
        "serving a model directory needs the MLX backend: pip install 'mlxcel[mlx]'"
    ) from exc

from mlxcel.backends.mlx.generator import MlxGenerator, MlxOptions

__all__ = ["MlxGenerator", "MlxOptions"]
