"""The one thread an MLX audio model makes every MLX call on: MLX streams belong to the thread
that made them, and that thread clears them before it ends."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


class MlxThread:
    """Runs each call on the model's own thread, one at a time, and waits for it."""

    def __init__(self, name: str) -> None:
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)

    def call(self, function: Callable[[], T]) -> T:
        """The function's result, computed on the thread."""
        return self._worker.submit(function).result()

    def end(self) -> None:
        """Clear the thread's MLX streams and end it."""
        import mlx.core as mx

        self._worker.submit(mx.clear_streams).result()
        self._worker.shutdown(wait=True)
