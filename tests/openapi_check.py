"""A bounded schemathesis run: every answer to what /openapi.json documents is a status it
lists, in the content type and schema it gives, never a server error."""

from __future__ import annotations

from typing import Any

import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    ignored_auth,
    response_schema_conformance,
    status_code_conformance,
)

# Fields a case may set, capped so that every generated request stays short: tokens, and
# an image's denoising steps and count.
_LIMITS = {
    "max_tokens": 4,
    "max_completion_tokens": 4,
    "max_output_tokens": 4,
    "n_predict": 4,
    "num_inference_steps": 2,
    "steps": 2,
}
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    ignored_auth,
]


def _bounded(case: Any, defaults: dict[str, Any]) -> None:
    if isinstance(case.body, dict):
        for name, value in defaults.items():
            case.body.setdefault(name, value)
        for name, cap in _LIMITS.items():
            value = case.body.get(name)
            if isinstance(value, int) and not isinstance(value, bool) and not 0 <= value <= cap:
                case.body[name] = cap
        if isinstance(case.body.get("n"), int):
            case.body["n"] = min(case.body["n"], 2)


def check_operations(
    root: str,
    headers: dict[str, str],
    examples: int,
    prefix: str = "",
    defaults: dict[str, Any] | None = None,
) -> int:
    """Run `examples` cases of every documented operation whose path starts with `prefix`,
    with the key and (ignored_auth) without it, `defaults` filling in the fields a body leaves
    out; the number of operations checked."""
    api = schemathesis.openapi.from_url(root + "/openapi.json", headers=headers)
    operations = [result.ok() for result in api.get_all_operations()]
    operations = [o for o in operations if o.path.startswith(prefix)]
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(
            max_examples=examples,
            deadline=None,
            phases=[Phase.explicit, Phase.generate],
            suppress_health_check=list(HealthCheck),
            database=None,
            # The same cases every run: CI checks a fixed sample, so a failure is a regression
            # that reproduces, not the luck of a draw (to explore more, turn this off and raise
            # the example count).
            derandomize=True,
        )
        def answers_as_documented(case: Any) -> None:
            _bounded(case, defaults or {})
            case.call_and_validate(headers=headers, checks=CHECKS, timeout=120)

        answers_as_documented()
    return len(operations)
