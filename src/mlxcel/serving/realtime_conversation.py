"""A conversation session's items and responses: `conversation.item.*`, `response.create` and
`response.cancel`, one response at a time, cancelled by the client or by the person speaking."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from mlxcel.protocol.errors import APIError
from mlxcel.protocol.realtime import RealtimeError
from mlxcel.protocol.realtime_update import response_settings
from mlxcel.serving.realtime_items import checked_item, new_id
from mlxcel.serving.realtime_response import Reply, run_reply

if TYPE_CHECKING:
    from mlxcel.serving.realtime_session import RealtimeSession

logger = logging.getLogger(__name__)


class Conversation:
    """The items, and the response in progress."""

    def __init__(self, session: RealtimeSession) -> None:
        self._session = session
        self.items: list[dict[str, Any]] = []
        self._reply: tuple[Reply, asyncio.Task[None]] | None = None
        self._why = "client_cancelled"

    def add(self, item: dict[str, Any]) -> None:
        """Add an item at the end."""
        self.items.append(item)

    def _find(self, event: dict[str, Any]) -> dict[str, Any]:
        item_id = event.get("item_id")
        found = next((i for i in self.items if i["id"] == item_id), None)
        if found is None:
            raise RealtimeError(
                f"no item '{item_id}' in this conversation", code="item_not_found", param="item_id"
            )
        return found

    async def handle(self, kind: str, event: dict[str, Any]) -> None:
        """A conversation or response event."""
        emit = self._session.emit
        if kind == "conversation.item.create":
            item = checked_item(event.get("item"))
            previous = self.items[-1]["id"] if self.items else None
            self.add(item)
            await emit("conversation.item.added", item=item, previous_item_id=previous)
            await emit("conversation.item.done", item=item, previous_item_id=previous)
        elif kind == "conversation.item.delete":
            self.items.remove(self._find(event))
            await emit("conversation.item.deleted", item_id=event["item_id"])
        elif kind == "conversation.item.retrieve":
            await emit("conversation.item.retrieved", item=self._find(event))
        elif kind == "conversation.item.truncate":
            # The text the model reads of its own turn is its transcript, kept whole.
            self._find(event)
            fields = {k: event.get(k) for k in ("item_id", "content_index", "audio_end_ms")}
            await emit("conversation.item.truncated", **fields)
        elif kind == "response.create":
            await self.respond(event.get("response"))
        elif kind == "response.cancel":
            if not await self.interrupt("client_cancelled"):
                raise RealtimeError(
                    "there is no response in progress to cancel",
                    code="response_cancel_not_active",
                )
        else:
            raise RealtimeError(f"unknown event type '{kind}'", code="unknown_event", param="type")

    async def respond(self, body: Any) -> None:
        """Start a response (an error if one is in progress)."""
        if self._reply is not None and not self._reply[1].done():
            raise RealtimeError(
                f"the response '{self._reply[0].id}' is in progress; cancel it or wait for its "
                "response.done",
                code="conversation_already_has_active_response",
            )
        settings = response_settings(self._session.config, body)
        reply = Reply(new_id("resp"), settings)
        self._reply = (reply, asyncio.ensure_future(self._run(reply)))

    async def interrupt(self, why: str = "turn_detected") -> bool:
        """Cancel the response in progress, if any, and wait for its response.done."""
        if self._reply is None or self._reply[1].done():
            return False
        self._why = why
        self._reply[1].cancel()
        await asyncio.wait([self._reply[1]])
        return True

    async def _run(self, reply: Reply) -> None:
        session = self._session
        await session.emit("response.created", response=reply.shape("in_progress"))
        status = "completed"
        details: dict[str, Any] | None = None
        try:
            await session.transcribed()
            chat = await session.models.chat(session.config.model)
            voice = None
            if reply.settings.modality == "audio":
                voice = await session.models.voice(None)
            await run_reply(reply, chat, voice, list(self.items), session.emit)
        except asyncio.CancelledError:
            status, details = "cancelled", {"type": "cancelled", "reason": self._why}
            if reply.text:
                reply.output.append(reply.message("incomplete"))
        except (APIError, RealtimeError) as exc:
            message = exc.message
            code = exc.code
            status = "failed"
            details = {
                "type": "failed",
                "error": {"type": exc.type, "code": code, "message": message},
            }
            await session.error(RealtimeError(message, code=code or "server_error", type=exc.type))
        except Exception:
            logger.exception("a realtime response failed")
            status = "failed"
            error = {
                "type": "server_error",
                "code": "server_error",
                "message": "the response failed",
            }
            details = {"type": "failed", "error": error}
        if reply.settings.in_conversation:
            self.items.extend(reply.output)
        await session.emit("response.done", response=reply.shape(status, details))

    def cancel(self) -> None:
        """Stop the response in progress (the session ends)."""
        if self._reply is not None:
            self._reply[1].cancel()
