"""The FastAPI application: routers, error envelope, auth and body limits."""

from __future__ import annotations

import json
import time

from fastapi import FastAPI
from prometheus_client import CollectorRegistry

from mlxcel.api.access_log import AccessLog
from mlxcel.api.body_check import JsonCheck
from mlxcel.api.cors import Cors
from mlxcel.api.errors import install_error_handlers
from mlxcel.api.hosts import HostAllowlist
from mlxcel.api.limits import BodySizeLimit, JsonByDefault
from mlxcel.api.openapi import install_openapi
from mlxcel.api.routes import (
    anthropic,
    audio,
    embeddings,
    health,
    images,
    lora,
    models,
    native,
    observe,
    ollama,
    ollama_models,
    ollama_pull,
    pulls,
    realtime,
    responses,
    text,
)
from mlxcel.api.routes.webui import webui_router
from mlxcel.api.shutdown import Drain, RefuseWhileDraining
from mlxcel.api.state import HoldModels
from mlxcel.config.settings import ServerConfig
from mlxcel.protocol.errors import APIError
from mlxcel.serving.encoder_limits import EncoderLimits
from mlxcel.serving.image_files import ImageFiles
from mlxcel.serving.images import ImageLimits
from mlxcel.serving.pulls import PullJobs


def _envelope(path: str, error: APIError) -> bytes | None:
    """The body of an error a middleware answers: Anthropic's shape on its routes."""
    if path.startswith("/v1/messages"):
        return json.dumps(anthropic.anthropic_error(error)).encode()
    return None


def create_app(config: ServerConfig) -> FastAPI:
    """An app that answers 503 on /health until `app.state.registry` is set."""
    app = FastAPI(title="mlxcel", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.registry = None
    app.state.load_error = None
    app.state.api_keys = config.api_keys
    app.state.encoder_limits = EncoderLimits(
        config.embedding_max_inputs, config.embedding_max_tokens, config.rerank_max_documents
    )
    app.state.media = config.media
    app.state.max_audio_seconds = config.max_audio_seconds
    app.state.started = int(time.time())
    app.state.metrics_registry = CollectorRegistry()
    install_error_handlers(app)
    app.include_router(health.public)
    app.state.image_files = ImageFiles(config.image_url_ttl, config.image_url_max_mib << 20)
    app.state.image_limits = ImageLimits(config.image_max_pixels, config.image_max_steps)
    app.state.pulls = PullJobs() if config.allow_downloads else None
    app.state.realtime = config.realtime
    app.state.realtime_sessions = set()
    # Before the unprefixed /models/{id} (a pull's routes live under /models/pull/).
    app.include_router(pulls.router)
    for openai_routes in (
        models.listing,
        text.router,
        responses.router,
        audio.router,
        images.router,
    ):
        app.include_router(openai_routes, prefix="/v1")
        # As llama-server does: a client whose base URL lacks /v1 still finds them.
        app.include_router(openai_routes, include_in_schema=False)
    # A WebSocket route: its key is checked in the route (a browser sends it as a subprotocol).
    app.include_router(realtime.router, prefix="/v1")
    app.include_router(realtime.router, include_in_schema=False)
    app.include_router(models.router)
    app.include_router(lora.router)
    app.include_router(native.router)
    app.include_router(embeddings.router)
    app.include_router(anthropic.router)
    app.include_router(ollama.router)
    app.include_router(ollama_models.router)
    app.include_router(ollama_pull.router)
    app.include_router(observe.router)
    if config.webui:
        app.include_router(webui_router())
    install_openapi(app, config)
    app.add_middleware(HoldModels)
    # Inside the body limit, which bounds what it reads.
    app.add_middleware(JsonCheck, envelope=_envelope)
    app.add_middleware(JsonByDefault)
    app.add_middleware(BodySizeLimit, max_bytes=config.max_body_bytes, envelope=_envelope)
    # Outside the body limit, so a browser can read a 413 too; a foreign origin gets 403
    # before anything reads its body.
    app.add_middleware(Cors, origins=config.cors_origins)
    if config.socket is None:
        app.add_middleware(HostAllowlist, bound=config.hosts, allowed=config.allowed_hosts)
    # Outside everything but the access log: once shutdown begins, nothing new reaches a route.
    app.state.drain = Drain()
    app.add_middleware(RefuseWhileDraining, drain=app.state.drain)
    # Outermost, so its line covers every answer, a 413 from the body limit included.
    app.add_middleware(AccessLog, envelope=_envelope)
    return app
