"""GET /metrics (Prometheus text) and GET /slots (what each slot is doing)."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from mlxcel.api.auth import require_api_key
from mlxcel.api.state import loaded_registry, model_for

router = APIRouter(dependencies=[Depends(require_api_key)])


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    """Every model's engine counters and latency histograms."""
    loaded_registry(request)
    body = generate_latest(request.app.state.metrics_registry)
    return Response(body, media_type=CONTENT_TYPE_LATEST)


@router.get("/slots")
async def slots(request: Request, model: str | None = None) -> list[dict[str, Any]]:
    """llama-server's /slots: one entry per slot of the model (default: the first)."""
    loaded = await model_for(request, model)
    n_ctx = loaded.generator.n_ctx_seq
    slots = await asyncio.to_thread(loaded.scheduler.slots)
    return [
        {
            "id": index,
            "id_task": report.state.request_id,
            "n_ctx": n_ctx,
            "is_processing": report.state.busy,
            "n_prompt_tokens": report.prompt_tokens,
            "n_cached_tokens": len(report.state.tokens),
            # A list of one, as llama-server's.
            "next_token": [
                {
                    "has_next_token": report.state.busy,
                    "has_new_line": report.new_line,
                    "n_remain": report.remaining,
                    "n_decoded": report.decoded,
                }
            ],
        }
        for index, report in enumerate(slots)
    ]
