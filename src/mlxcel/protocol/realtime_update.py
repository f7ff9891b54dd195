"""`session.update` (GA or beta) and `transcription_session.update` applied to a session's
configuration, and a `response.create`'s own settings: every field checked, an unknown one an
error naming it, and nothing changed when any field is wrong."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal

from mlxcel.protocol.realtime import (
    RealtimeError,
    SessionConfig,
    fail,
    input_format,
    object_of,
    output_format,
    refuse_unknown,
    string_of,
    transcription,
    turn_detection,
)

_GA_KNOWN = {"type", "model", "instructions", "output_modalities", "audio", "tools"}
_GA_KNOWN |= {"tool_choice", "max_output_tokens"}
_BETA_KNOWN = {"modalities", "voice", "input_audio_format", "output_audio_format"}
_BETA_KNOWN |= {"input_audio_transcription", "turn_detection", "temperature"}
_BETA_KNOWN |= {"max_response_output_tokens", "instructions", "tools", "tool_choice", "model"}


def updated(config: SessionConfig, body: Any, event: str) -> SessionConfig:
    """`config` with a session update's fields applied."""
    session = object_of(body, "session")
    kind = session.get("type")
    if event == "transcription_session.update":
        kind = kind or "transcription"
    if kind is not None and kind != config.kind:
        raise RealtimeError(
            f"this is a {config.kind} session; 'session.type' cannot change it to '{kind}' "
            "(open a transcription session with ?intent=transcription)",
            code="invalid_value",
            param="session.type",
        )
    changes: dict[str, Any] = {}
    refuse_unknown(session, _GA_KNOWN | _BETA_KNOWN, "session")
    if "audio" in session:
        changes |= _ga_audio(object_of(session["audio"], "session.audio"), config)
    changes |= _beta_audio(session)
    changes |= _answering(session, config)
    return replace(config, **changes)


def _ga_audio(audio: dict[str, Any], config: SessionConfig) -> dict[str, Any]:
    refuse_unknown(audio, {"input", "output"}, "session.audio")
    changes: dict[str, Any] = {}
    if "input" in audio:
        given = object_of(audio["input"], "session.audio.input")
        where = "session.audio.input"
        refuse_unknown(given, {"format", "transcription", "turn_detection"}, where)
        if "format" in given:
            changes["input_format"] = input_format(given["format"], f"{where}.format")
        if "transcription" in given:
            changes["transcription"] = transcription(
                given["transcription"], f"{where}.transcription"
            )
        if "turn_detection" in given:
            found = turn_detection(given["turn_detection"], f"{where}.turn_detection")
            changes["turn_detection"] = found
    if "output" in audio:
        given = object_of(audio["output"], "session.audio.output")
        refuse_unknown(given, {"format", "voice"}, "session.audio.output")
        if "format" in given:
            output_format(given["format"], "session.audio.output.format")
        if "voice" in given:
            changes["voice"] = string_of(given["voice"], "session.audio.output.voice")
    return changes


def _beta_audio(session: dict[str, Any]) -> dict[str, Any]:
    changes: dict[str, Any] = {}
    if "input_audio_format" in session:
        changes["input_format"] = input_format(session["input_audio_format"], "input_audio_format")
    if "output_audio_format" in session:
        output_format(session["output_audio_format"], "session.output_audio_format")
    if "input_audio_transcription" in session:
        given = session["input_audio_transcription"]
        changes["transcription"] = transcription(given, "session.input_audio_transcription")
    if "turn_detection" in session:
        found = turn_detection(session["turn_detection"], "session.turn_detection")
        changes["turn_detection"] = found
    if "voice" in session:
        changes["voice"] = string_of(session["voice"], "session.voice")
    return changes


def _answering(session: dict[str, Any], config: SessionConfig) -> dict[str, Any]:
    changes: dict[str, Any] = {}
    if "model" in session:
        changes["model"] = string_of(session["model"], "session.model")
    if "instructions" in session:
        changes["instructions"] = string_of(session["instructions"], "session.instructions") or ""
    for name in ("output_modalities", "modalities"):
        if name in session:
            changes["modality"] = modality(session[name], f"session.{name}")
    if "tools" in session:
        changes["tools"] = tools(session["tools"], "session.tools")
    if "tool_choice" in session:
        changes["tool_choice"] = tool_choice(session["tool_choice"], "session.tool_choice")
    if "temperature" in session:
        changes["temperature"] = temperature(session["temperature"], "session.temperature")
    for name in ("max_output_tokens", "max_response_output_tokens"):
        if name in session:
            changes["max_output_tokens"] = max_tokens(session[name], f"session.{name}")
    return changes


def modality(value: Any, param: str) -> Literal["audio", "text"]:
    """["audio"] (with its transcript; beta: ["text", "audio"]) or ["text"]."""
    if not isinstance(value, list) or not value or not set(value) <= {"text", "audio"}:
        raise fail(param, 'must be ["audio"] or ["text"]')
    return "audio" if "audio" in value else "text"


def tools(value: Any, param: str) -> tuple[dict[str, Any], ...]:
    """Function tools: {type: function, name, description, parameters}."""
    if not isinstance(value, list):
        raise fail(param, "must be a list of tools", "invalid_type")
    found = []
    for i, tool in enumerate(value):
        where = f"{param}[{i}]"
        body = object_of(tool, where)
        if body.get("type", "function") != "function":
            raise fail(f"{where}.type", "must be 'function': the tools served here")
        refuse_unknown(body, {"type", "name", "description", "parameters"}, where)
        name = string_of(body.get("name"), f"{where}.name", optional=False)
        parameters = body.get("parameters", {"type": "object", "properties": {}})
        object_of(parameters, f"{where}.parameters")
        description = string_of(body.get("description"), f"{where}.description") or ""
        found.append(
            {"type": "function", "name": name, "description": description, "parameters": parameters}
        )
    return tuple(found)


def tool_choice(value: Any, param: str) -> str | dict[str, Any]:
    """auto, none, required, or {type: function, name}."""
    if value in ("auto", "none", "required"):
        return str(value)
    body = object_of(value, param)
    if body.get("type") != "function" or not isinstance(body.get("name"), str):
        raise fail(param, "must be auto, none, required or {type: function, name}")
    return {"type": "function", "name": body["name"]}


def temperature(value: Any, param: str) -> float:
    """A sampling temperature from 0 to 2."""
    if not isinstance(value, int | float) or isinstance(value, bool) or not 0 <= value <= 2:
        raise fail(param, "must be a number from 0 to 2")
    return float(value)


def max_tokens(value: Any, param: str) -> int | None:
    """A token bound from 1 to 4096, or "inf" (None)."""
    if value == "inf" or value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 4096:
        raise fail(param, 'must be from 1 to 4096, or "inf"')
    return value


@dataclass(frozen=True)
class ResponseSettings:
    """A response's own settings: the session's, with a `response.create`'s over them."""

    instructions: str
    modality: Literal["audio", "text"]
    tools: tuple[dict[str, Any], ...]
    tool_choice: str | dict[str, Any]
    max_output_tokens: int | None
    voice: str | None
    in_conversation: bool = True
    metadata: dict[str, Any] | None = None


def response_settings(config: SessionConfig, body: Any) -> ResponseSettings:
    """The settings of the response a `response.create` asks for."""
    settings = ResponseSettings(
        config.instructions,
        config.modality,
        config.tools,
        config.tool_choice,
        config.max_output_tokens,
        config.voice,
    )
    if body is None:
        return settings
    given = object_of(body, "response")
    known = {"instructions", "output_modalities", "modalities", "tools", "tool_choice"}
    known |= {"max_output_tokens", "max_response_output_tokens", "conversation", "metadata"}
    known |= {"voice", "audio", "temperature", "output_audio_format"}
    refuse_unknown(given, known, "response")
    changes: dict[str, Any] = {}
    if "instructions" in given:
        changes["instructions"] = string_of(given["instructions"], "response.instructions") or ""
    for name in ("output_modalities", "modalities"):
        if name in given:
            changes["modality"] = modality(given[name], f"response.{name}")
    if "tools" in given:
        changes["tools"] = tools(given["tools"], "response.tools")
    if "tool_choice" in given:
        changes["tool_choice"] = tool_choice(given["tool_choice"], "response.tool_choice")
    for name in ("max_output_tokens", "max_response_output_tokens"):
        if name in given:
            changes["max_output_tokens"] = max_tokens(given[name], f"response.{name}")
    if "conversation" in given:
        if given["conversation"] not in ("auto", "none"):
            raise fail("response.conversation", "must be 'auto' or 'none'")
        changes["in_conversation"] = given["conversation"] == "auto"
    if "metadata" in given:
        changes["metadata"] = object_of(given["metadata"], "response.metadata")
    if "voice" in given:
        changes["voice"] = string_of(given["voice"], "response.voice")
    if "temperature" in given:
        temperature(given["temperature"], "response.temperature")
    return replace(settings, **changes)
