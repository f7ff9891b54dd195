"""GET /metrics (Prometheus text), GET /slots (what each slot is doing) and llama-server's
slot actions, POST /slots/{id}?action=save|restore|erase (engine/slot_files.py)."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from mlxcel.api.auth import require_api_key
from mlxcel.api.state import loaded_registry, model_for
from mlxcel.engine.slot_files import ACTIONS, filename_problem
from mlxcel.engine.types import EngineError
from mlxcel.protocol.errors import APIError, invalid_request

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


def _not_supported(message: str) -> APIError:
    return APIError(501, message, type="not_supported_error", code="not_supported")


@router.post("/slots/{id_slot}")
async def slot_action(
    request: Request, id_slot: str, action: str = "", model: str | None = None
) -> dict[str, Any]:
    """llama-server's slot save, restore and erase, with files under --slot-save-path."""
    loaded = await model_for(request, model)
    if loaded.config.slot_save_path is None:
        raise _not_supported(
            "This server does not support slots action. Start it with `--slot-save-path`"
        )
    if not id_slot.isdigit() or int(id_slot) >= loaded.generator.n_slots:
        raise invalid_request("Invalid slot ID", "id_slot")
    if action not in ACTIONS:
        raise invalid_request("Invalid action: use save, restore or erase", "action")
    filename: Any = ""
    if action != "erase":
        body = await request.json() if await request.body() else None
        filename = body.get("filename") if isinstance(body, dict) else None
        if not isinstance(filename, str):
            raise invalid_request("'filename' is required: a file name string", "filename")
        problem = filename_problem(filename)
        if problem is not None:
            raise invalid_request(f"Invalid filename: {problem}", "filename")
    try:
        return await asyncio.to_thread(loaded.scheduler.slot_file, action, int(id_slot), filename)
    except EngineError as exc:
        if exc.code == "not_supported":
            raise _not_supported(str(exc)) from exc
        if exc.code in ("server_error", "shutting_down"):
            raise APIError(500 if exc.code == "server_error" else 503, str(exc)) from exc
        raise invalid_request(str(exc)) from exc
