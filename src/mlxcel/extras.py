"""How a missing engine is installed: mlxcel is not on PyPI, so an error names the extra and
the command that adds it where mlxcel was installed from (the checkout, or a wheel built there)."""

from __future__ import annotations


def install_extra(extra: str) -> str:
    """The hint an error gives for a missing optional engine."""
    return (
        f"install mlxcel's '{extra}' extra (in its checkout: .venv/bin/pip install -e "
        f"'.[{extra}]'; from a wheel: pip install 'dist/mlxcel-*.whl[{extra}]')"
    )
