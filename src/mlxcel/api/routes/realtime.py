"""GET /v1/realtime: OpenAI's Realtime API over a WebSocket, for live transcription
(`?intent=transcription`) and spoken conversations with the served models.

The API key comes as every route's (`Authorization: Bearer`, `X-Api-Key`) or, from a browser,
which cannot set headers on a WebSocket, as the subprotocol `openai-insecure-api-key.KEY`
(OpenAI's). A refused key is a 401 before the upgrade; the origin and Host policy is the HTTP
routes' (`cors.py`, `hosts.py`). Each session is held to the --realtime-* limits.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
from typing import Any

from fastapi import APIRouter, WebSocket
from fastapi.responses import JSONResponse
from starlette.websockets import WebSocketDisconnect, WebSocketState

from mlxcel.api.auth import presented_key
from mlxcel.api.state import loaded_registry, served_for
from mlxcel.config.realtime import RealtimeConfig
from mlxcel.models.audio import SpeechModel, TranscriptionModel
from mlxcel.models.loaded import Capability, Loaded, LoadedModel
from mlxcel.protocol.errors import APIError
from mlxcel.protocol.realtime import RealtimeError, SessionConfig, SessionKind
from mlxcel.serving.realtime_items import new_id
from mlxcel.serving.realtime_session import RealtimeSession, SessionLimits, SessionModels

logger = logging.getLogger(__name__)
router = APIRouter()

KEY_PROTOCOL = "openai-insecure-api-key."
# Close codes: 1000 the session ended (idle or at its length), 1013 try again later (full).
CLOSE_ENDED = 1000
CLOSE_FULL = 1013


def _key(websocket: WebSocket) -> str | None:
    offered: list[str] = websocket.scope.get("subprotocols") or []
    from_protocol = next(
        (p[len(KEY_PROTOCOL) :] for p in offered if p.startswith(KEY_PROTOCOL)), None
    )
    return presented_key(websocket) or from_protocol


def _refusal(websocket: WebSocket) -> APIError | None:
    keys: tuple[str, ...] = websocket.app.state.api_keys
    if not keys:
        return None
    key = _key(websocket)
    if key is None:
        return APIError(
            401,
            "missing API key: send 'Authorization: Bearer KEY' (a browser: the subprotocol "
            f"'{KEY_PROTOCOL}KEY')",
            code="invalid_api_key",
        )
    if not any(hmac.compare_digest(key.encode(), k.encode()) for k in keys):
        return APIError(401, "invalid API key", code="invalid_api_key")
    return None


def _subprotocol(websocket: WebSocket) -> str | None:
    offered: list[str] = websocket.scope.get("subprotocols") or []
    if "realtime" in offered:
        return "realtime"
    return next((p for p in offered if not p.startswith(KEY_PROTOCOL)), None)


def _models(websocket: WebSocket, config: RealtimeConfig) -> SessionModels:
    """The models a session joins, each leased once, for the session's life."""
    held: dict[tuple[Capability, str | None], Loaded] = {}

    async def lease(capability: Capability, asked: str | None, configured: str | None) -> Loaded:
        name = configured if configured is not None and not _serves(websocket, asked) else asked
        if (capability, name) not in held:
            held[(capability, name)] = await served_for(websocket, name, capability)
        return held[(capability, name)]

    async def transcriber(name: str | None) -> TranscriptionModel:
        model = await lease("transcription", name, config.transcription_model)
        assert isinstance(model, TranscriptionModel)
        return model

    async def chat(name: str | None) -> LoadedModel:
        model = await lease("text", name, config.chat_model)
        if not isinstance(model, LoadedModel):
            raise APIError(
                400, f"the model '{model.name}' does not generate text", code="model_not_supported"
            )
        return model

    async def voice(name: str | None) -> SpeechModel:
        model = await lease("speech", name, config.speech_model)
        assert isinstance(model, SpeechModel)
        return model

    return SessionModels(transcriber, chat, voice)


def _serves(websocket: WebSocket, name: str | None) -> bool:
    """Whether `name` is one of the served models' own names (not an OpenAI stand-in)."""
    if name is None:
        return False
    registry = loaded_registry(websocket)
    try:
        registry.named(name)
    except Exception:
        return False
    return True


def _session_config(websocket: WebSocket) -> SessionConfig:
    query = websocket.query_params
    kind: SessionKind = "transcription" if query.get("intent") == "transcription" else "realtime"
    prefix = "sess" if kind == "realtime" else "transcription_sess"
    return SessionConfig(kind=kind, id=new_id(prefix), model=query.get("model"))


@router.websocket("/realtime")
async def realtime(websocket: WebSocket) -> None:
    """A Realtime API session."""
    refusal = _refusal(websocket)
    if refusal is not None:
        await websocket.send_denial_response(JSONResponse(refusal.body(), refusal.status))
        return
    config: RealtimeConfig = websocket.app.state.realtime
    sessions: set[str] = websocket.app.state.realtime_sessions
    await websocket.accept(subprotocol=_subprotocol(websocket))
    lock = asyncio.Lock()
    active = [time.monotonic()]  # when the last event went either way

    async def send(event: dict[str, Any]) -> None:
        active[0] = time.monotonic()
        async with lock:
            if websocket.application_state is WebSocketState.CONNECTED:
                await websocket.send_text(json.dumps(event))

    if len(sessions) >= config.max_sessions:
        error = RealtimeError(
            f"the server holds {config.max_sessions} realtime sessions, its most "
            "(--realtime-max-sessions); retry shortly",
            code="too_many_sessions",
            type="server_busy",
        )
        await send({"type": "error", "event_id": new_id("event"), "error": error.event_error(None)})
        await websocket.close(CLOSE_FULL, "too many realtime sessions")
        return
    session_config = _session_config(websocket)
    limits = SessionLimits(config.max_audio_seconds, websocket.app.state.max_audio_seconds)
    session = RealtimeSession(session_config, _models(websocket, config), limits, send)
    sessions.add(session_config.id)
    logger.info("realtime session %s opened (%s)", session_config.id, session_config.kind)
    try:
        await session.start()
        await _serve(websocket, session, config, active)
    except WebSocketDisconnect:
        pass
    finally:
        session.close()
        sessions.discard(session_config.id)
        logger.info("realtime session %s closed", session_config.id)


async def _serve(
    websocket: WebSocket, session: RealtimeSession, config: RealtimeConfig, active: list[float]
) -> None:
    """Read client events until the client leaves, idles (no event either way for
    --realtime-idle-timeout) or the session reaches its length."""
    ends = time.monotonic() + config.max_session_seconds
    while True:
        now = time.monotonic()
        idle_ends = active[0] + config.idle_timeout
        try:
            message = await asyncio.wait_for(websocket.receive(), min(idle_ends, ends) - now)
        except TimeoutError:
            now = time.monotonic()
            if now < ends and now < active[0] + config.idle_timeout:
                continue  # the server spoke meanwhile: not idle
            expired = now >= ends
            why = (
                f"the session reached its length, {config.max_session_seconds:g} s "
                "(--realtime-max-session-seconds)"
                if expired
                else f"no event came either way for {config.idle_timeout:g} s "
                "(--realtime-idle-timeout)"
            )
            code = "session_expired" if expired else "idle_timeout"
            await session.error(RealtimeError(why, code=code))
            await websocket.close(CLOSE_ENDED, code)
            return
        if message["type"] == "websocket.disconnect":
            return
        active[0] = time.monotonic()
        await _event(session, message.get("text") or message.get("bytes") or "", config)


async def _event(session: RealtimeSession, data: str | bytes, config: RealtimeConfig) -> None:
    if len(data) > config.max_message_bytes:
        error = RealtimeError(
            f"the event is {len(data)} bytes; events are limited to {config.max_message_bytes} "
            "bytes (--realtime-max-message-bytes): send audio in smaller appends",
            code="message_too_large",
        )
        await session.error(error)
        return
    try:
        event = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        await session.error(RealtimeError("the event is not valid JSON", code="invalid_json"))
        return
    if not isinstance(event, dict):
        await session.error(RealtimeError("the event must be a JSON object", code="invalid_event"))
        return
    await session.handle(event)
