"""The request side of /openapi.json: what FastAPI cannot see of what a route takes.

The multipart forms that routes read themselves (an image edit, a transcription, a
translation), the limits the routes check in code (a prompt is never empty, token ids are
never negative), and only the operations this server's models can serve: a route for a kind
of model the server was not started with answers 400 to every request, so the document leaves
it out rather than call its requests valid.
"""

from __future__ import annotations

from typing import Any

from mlxcel.api.routes.embeddings import RERANK_PATHS
from mlxcel.backends.audio.languages import LANGUAGES
from mlxcel.config.settings import ModelConfig
from mlxcel.models.loaded import CAPABILITIES, Capability
from mlxcel.protocol.audio import TRANSCRIPT_FORMATS
from mlxcel.protocol.images import ImageEditRequest

BINARY = {"type": "string", "format": "binary"}
_STRING = {"type": "string"}
# An edit's multipart body: the options of ImageEditRequest, its images and its mask as files.
_EDIT_FILES = {
    "image": {
        "anyOf": [BINARY, {"type": "array", "items": BINARY}],
        "description": "the image to edit (also accepted as image[])",
    },
    "mask": {**BINARY, "description": "PNG whose transparent pixels are repainted"},
}
_FORMAT = {"type": "string", "enum": list(TRANSCRIPT_FORMATS)}
_TEMPERATURE = {"type": "number", "minimum": 0, "maximum": 1}
_TRANSLATION_FIELDS: dict[str, Any] = {
    "file": {**BINARY, "description": "the audio (WAV, FLAC, MP3, OGG, WebM, M4A; 25 MiB)"},
    "model": _STRING,
    "prompt": _STRING,
    "response_format": _FORMAT,
    "temperature": _TEMPERATURE,
}


def _form(fields: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["file"],
        "properties": fields,
        "additionalProperties": False,
    }


TRANSLATION_FORM = _form(_TRANSLATION_FIELDS)
TRANSCRIPTION_FORM = _form(
    {
        **_TRANSLATION_FIELDS,
        "language": {"type": "string", "enum": ["", *sorted(LANGUAGES)]},
        "timestamp_granularities[]": {
            "type": "array",
            "items": {"type": "string", "enum": ["word", "segment"]},
            "description": "needs response_format verbose_json",
        },
        "stream": {"type": "boolean", "description": "with response_format json or text"},
        "include[]": {
            "type": "array",
            "items": {"const": "logprobs"},
            "description": "needs response_format json",
        },
        "chunking_strategy": {**_STRING, "description": "accepted; Whisper cuts 30 s windows"},
    }
)
_FORMS = {
    "/v1/audio/transcriptions": ("TranscriptionForm", TRANSCRIPTION_FORM),
    "/v1/audio/translations": ("TranslationForm", TRANSLATION_FORM),
}
# The routes only a model of one capability serves (the text routes are always there).
_NEEDS: dict[str, tuple[Capability, ...]] = {
    "/v1/embeddings": ("embedding",),
    "/embedding": ("embedding",),
    "/embeddings": ("embedding",),
    "/api/embed": ("embedding",),
    "/api/embeddings": ("embedding",),
    **{path: ("rerank",) for path in (*RERANK_PATHS, "/v2/rerank")},
    "/v1/audio/transcriptions": ("transcription",),
    "/v1/audio/translations": ("transcription",),
    "/v1/audio/speech": ("speech",),
    "/v1/audio/voices": ("speech",),
    "/v1/images/generations": ("image_generation",),
    "/v1/images/edits": ("image_edit",),
    "/v1/images/files/{file_id}": ("image_generation",),
}
# Request fields that are prompts (never empty) or token ids (never negative), by model.
_PROMPTS = {"CompletionRequest": "prompt", "NativeCompletionRequest": "prompt"}
_TOKEN_IDS = {"DetokenizeRequest": "tokens"}


def served_capabilities(models: tuple[ModelConfig, ...]) -> set[Capability]:
    """What the configured models can do together."""
    return {capability for model in models for capability in CAPABILITIES[model.kind]}


def keep_served(document: dict[str, Any], capabilities: set[Capability]) -> None:
    """Leave out the operations of routes no configured model serves."""
    paths = document["paths"]
    for path, needs in _NEEDS.items():
        if path in paths and not capabilities.intersection(needs):
            del paths[path]


def add_forms(document: dict[str, Any], schemas: dict[str, Any]) -> None:
    """The multipart bodies the image edit and audio routes read themselves."""
    edit = ImageEditRequest.model_json_schema()
    edit["properties"] = {**_EDIT_FILES, **edit["properties"]}
    edit["required"] = ["image", *edit.get("required", [])]
    forms = {"/v1/images/edits": (ImageEditRequest.__name__, edit), **_FORMS}
    for path, (name, schema) in forms.items():
        operation = document["paths"].get(path, {}).get("post")
        if operation is None:
            continue
        schemas[name] = schema
        form = {"schema": {"$ref": f"#/components/schemas/{name}"}}
        operation["requestBody"] = {"required": True, "content": {"multipart/form-data": form}}


def _bounded(schema: dict[str, Any]) -> None:
    """Strings and lists at least one long, integers (token ids) at least 0, all the way down."""
    kind = schema.get("type")
    if kind == "string":
        schema["minLength"] = max(schema.get("minLength", 0), 1)
    elif kind == "integer":
        schema["minimum"] = max(schema.get("minimum", 0), 0)
    elif kind == "array":
        schema["minItems"] = max(schema.get("minItems", 0), 1)
        _bounded(schema.get("items", {}))
    for branch in schema.get("anyOf", ()):
        _bounded(branch)


def bound_prompts(schemas: dict[str, Any]) -> None:
    """A prompt is never empty and a token id never negative (the routes refuse both)."""
    for model, field in {**_PROMPTS, **_TOKEN_IDS}.items():
        for name in (model, f"{model}-Input"):
            schema = schemas.get(name, {}).get("properties", {}).get(field)
            if schema is not None:
                if model in _TOKEN_IDS:
                    _bounded(schema["items"])
                else:
                    _bounded(schema)
