"""Getting models over HTTP, for UIs: POST /models/pull (and its progress as server-sent
events, its state, its cancel) and DELETE /models/{name}; POST /models/load with a `path`
adds what was pulled to the running server. All behind --allow-downloads and the API key;
GET /models/local, what is on disk, only behind the key (it changes nothing)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, StreamingResponse

from mlxcel.api.auth import require_api_key
from mlxcel.api.body_check import CheckedJsonRoute
from mlxcel.api.sse import typed_frame
from mlxcel.api.state import loaded_registry
from mlxcel.config.settings import ModelConfig
from mlxcel.hub.inventory import RemoveError, local_models, remove
from mlxcel.hub.pull import PullError
from mlxcel.protocol.errors import APIError, invalid_request
from mlxcel.protocol.models import ModelPull
from mlxcel.serving.pulls import PullJob, PullJobs
from mlxcel.weights import WeightsError, resolve_model

router = APIRouter(route_class=CheckedJsonRoute, dependencies=[Depends(require_api_key)])


def downloads(request: Request) -> PullJobs:
    """The server's downloads; 403 without --allow-downloads."""
    jobs: PullJobs | None = request.app.state.pulls
    if jobs is None:
        raise APIError(
            403,
            "downloads are off on this server: start it with --allow-downloads to pull or "
            "remove models over HTTP (or use `mlxcel pull` on its machine)",
            code="downloads_disabled",
        )
    return jobs


def _job(request: Request, job_id: str) -> PullJob:
    job = downloads(request).get(job_id)
    if job is None:
        raise APIError(404, f"no pull '{job_id}'", code="not_found", param="id")
    return job


def _on_disk(path: str) -> Path:
    """A model on this machine: what `mlxcel list` names it, or its path (400 otherwise)."""
    listed = {m.name: m.path for m in local_models()}
    if path in listed:
        return listed[path]
    local = Path(path).expanduser()
    if not local.exists():
        raise invalid_request(
            f"no model at '{path}': give a GGUF file or model folder, or a name `mlxcel list` "
            "shows (pull it first: POST /models/pull)",
            "path",
        )
    try:
        return resolve_model(str(local))
    except WeightsError as exc:
        raise invalid_request(str(exc), "path") from None


async def added(request: Request, name: str, path: str) -> None:
    """Add the model at `path` under `name`, loaded on its first request, as its first text
    model's threads, context and slots say; nothing to do if `name` is served from there."""
    downloads(request)
    registry = loaded_registry(request)
    model = await asyncio.to_thread(_on_disk, path)
    known = next((e for e in registry.entries() if e.answers_to(name)), None)
    if known is not None:
        if known.config.model == model:
            return
        raise APIError(409, f"a model is already served as '{name}'", param="model")
    config = ModelConfig(model=model, alias=name, on_demand=True)
    like = next((e.config for e in registry.entries() if e.config.kind == "text"), None)
    if like is not None:
        config = replace(
            config, threads=like.threads, ctx_size=like.ctx_size, parallel=like.parallel
        )
    registry.add(config)


@router.get("/models/local")
async def on_disk(request: Request) -> dict[str, Any]:
    """The models on this machine `mlxcel serve` can serve (what `mlxcel list` shows), and
    whether this server pulls and removes; their paths only with an API key set, as for
    GET /v1/models (docs/security.md)."""
    keyed = bool(request.app.state.api_keys)
    data = []
    for model in await asyncio.to_thread(local_models):
        listed: dict[str, Any] = {
            "name": model.name,
            "kind": model.kind,
            "size_bytes": model.size,
            "quantization": model.quantization,
        }
        if keyed:
            listed["path"] = str(model.path)
        data.append(listed)
    downloads_on = request.app.state.pulls is not None
    return {"object": "list", "data": data, "downloads": downloads_on}


@router.post("/models/pull", status_code=202)
async def start_pull(body: ModelPull, request: Request) -> dict[str, Any]:
    """Start downloading a model; answers at once with the pull's id and size."""
    try:
        job = await downloads(request).start(body.model)
    except PullError as exc:
        raise invalid_request(str(exc), "model") from None
    return job.state()


@router.get("/models/pull/{job_id}")
async def pull_state(job_id: str, request: Request) -> dict[str, Any]:
    """How far a pull is, or how it ended."""
    return _job(request, job_id).state()


@router.get("/models/pull/{job_id}/events")
async def pull_events(job_id: str, request: Request) -> StreamingResponse:
    """The pull's progress as server-sent events, ending with done, failed or cancelled."""
    job = _job(request, job_id)

    async def frames() -> Any:
        async for event in PullJobs.events(job):
            yield typed_frame(event)

    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return StreamingResponse(frames(), media_type="text/event-stream", headers=headers)


@router.delete("/models/pull/{job_id}")
async def cancel_pull(job_id: str, request: Request) -> dict[str, Any]:
    """Stop a pull at its next chunk (its events end with `cancelled`); what it fetched
    stays, and a later pull resumes it. Answers once it stopped, or after a second with
    the state it is in (a stalled connection's next chunk may be a while coming)."""
    job = _job(request, job_id)
    job.tracker.cancel()
    await asyncio.to_thread(job.ended.wait, 1.0)
    return job.state()


@router.delete("/models/{org}/{repo:path}", response_model=None)
async def delete_model(org: str, repo: str, request: Request) -> JSONResponse:
    """Remove a model from the Hugging Face cache (ORG/NAME or ORG/NAME:FILE: a repo's name
    always has its owner, so /models/load and the like are never taken for one); 409 while
    a process (a model this server serves) holds it."""
    downloads(request)
    name = f"{org}/{repo}"
    try:
        removed = await asyncio.to_thread(remove, name)
    except RemoveError as exc:
        status = 409 if "in use" in str(exc) else 404
        raise APIError(status, str(exc), param="name") from None
    return JSONResponse({"deleted": name, "paths": [str(p) for p in removed]})
