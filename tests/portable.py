"""Helpers for assertions that hold on any CPU (see docs/development.md, "Tests that hold")."""

from __future__ import annotations


def stop_inside(text: str, length: int = 2) -> str:
    """A stop string of `length` characters taken from the middle of `text`, not blank.

    Stop tests take their stop string from the server's own greedy output, so they never
    depend on which words a CPU's kernels make the model write.
    """
    for start in range(len(text) // 2, len(text) - length + 1):
        if text[start : start + length].strip():
            return text[start : start + length]
    raise AssertionError(f"no stop string inside {text!r}")
