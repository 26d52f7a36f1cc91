"""The API description (``/openapi.json``) made to say what the server does.

FastAPI's document knows the routes and their JSON bodies, not what happens around them: errors
are 400 here, never 422 (``errors.install_error_handlers``), and come from middleware and limits
too (the API key, connection and body limits, admission, deadlines); speech returns audio and
/metrics text; the multipart endpoints read their form by hand, so FastAPI sees no body. This
module rewrites the generated document once, in one place: rules by what an operation is
(behind the key, takes input, takes a body, runs through the pipeline) for every operation, and
``OPERATIONS`` for what only the operation knows. tests/core/serve/test_openapi.py walks every
route of the app and fails for one that ``OPERATIONS`` does not describe, and a schemathesis run
against real servers (tests/core/serve/test_openapi_conformance.py) keeps the document true.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from omni_core.serve.protocol import TRANSCRIPTION_FORMATS
from omni_core.surface.audio_codecs import CONTENT_TYPES

ERROR = {"$ref": "#/components/schemas/Error"}
ERROR_SCHEMA = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}
RETRY_AFTER = {"Retry-After": {"description": "seconds to wait before retrying", "schema": {"type": "string"}}}
ERRORS = {
    "400": "invalid request: a parameter, the body, or content a stage refuses (the message names it)",
    "401": "the API key is missing or wrong",
    "404": "unknown model (`model_not_found`) or voice",
    "408": "the request did not arrive whole within --receive-timeout; the connection closes",
    "413": "a body, upload, text or audio past the server's limits",
    "429": "--max-running requests run and --max-queued wait",
    "500": "a stage failed the request (`stage_failed`)",
    "503": "loading (`not_ready`), draining, a stage being restarted, or a connection past --max-connections",
    "504": "the request ran past its deadline (`deadline_exceeded`)",
}
BINARY = {"type": "string", "format": "binary"}
TEXT = {"type": "string"}
# each event of a stream, as OpenAPI before 3.2 reads a text/event-stream schema
SSE_EVENT = {
    "type": "object",
    "required": ["data"],
    "properties": {"data": {"type": "string", "description": "a JSON object; chat's last event is [DONE]"}},
}
SSE = {"text/event-stream": {"schema": SSE_EVENT}}
# what speech can answer: every format it encodes (aac has no encoder: 400)
AUDIO = {media: {"schema": BINARY} for fmt, media in CONTENT_TYPES.items() if fmt != "aac"}
SAMPLE_RATE = {"X-Sample-Rate": {"description": "the audio's sample rate (Hz)", "schema": {"type": "string"}}}
JSON = {"application/json": {"schema": {"type": "object"}}}
STRING_OR_NULL = {"type": ["string", "null"]}
# JSON success bodies a client reads field by field (chat's are OpenAI's chat.completion)
BODIES = {
    "Health": {
        "type": "object",
        "required": ["status", "running", "queued"],
        "properties": {
            "status": {"type": "string", "enum": ["ready", "loading", "draining", "unavailable", "failed"]},
            "running": {"type": "integer"},
            "queued": {"type": "integer"},
            "error": {
                "type": "string",
                "description": "why the server is not ready: loading failed, or its Ray cluster unreachable or lost",
            },
        },
    },
    "Model": {
        "type": "object",
        "required": ["id", "object", "created", "owned_by", "family", "tasks", "root"],
        "properties": {
            "id": {"type": "string"},
            "object": {"const": "model"},
            "created": {"type": "integer"},
            "owned_by": {"type": "string"},
            "family": {"type": "string"},
            "tasks": {"type": "array", "items": {"type": "string"}},
            "root": STRING_OR_NULL,
        },
    },
    "ModelList": {
        "type": "object",
        "required": ["object", "data"],
        "properties": {"object": {"const": "list"}, "data": {"type": "array", "items": {"$ref": "#/components/schemas/Model"}}},
    },
    "Voice": {
        "type": "object",
        "required": ["id", "name", "object", "type"],
        "properties": {
            "id": {"type": "string"},
            "name": {"type": "string"},
            "object": {"const": "audio.voice"},
            "type": {"type": "string", "enum": ["builtin", "saved"]},
            "description": {"type": "string", "description": "builtin"},
            "text": {"type": "string", "description": "saved: what the reference audio says"},
            "sample_rate": {"type": "integer", "description": "saved"},
            "duration": {"type": "number", "description": "saved: seconds"},
            "created_at": {"type": "integer", "description": "saved: unix seconds"},
        },
    },
    "VoiceList": {
        "type": "object",
        "required": ["object", "data"],
        "properties": {"object": {"const": "list"}, "data": {"type": "array", "items": {"$ref": "#/components/schemas/Voice"}}},
    },
    "DeletedVoice": {
        "type": "object",
        "required": ["id", "object", "deleted"],
        "properties": {"id": {"type": "string"}, "object": {"const": "audio.voice"}, "deleted": {"const": True}},
    },
    "Transcription": {
        "type": "object",
        "required": ["text"],
        "description": "json: text (and usage); verbose_json adds task, language, duration, segments and words",
        "properties": {
            "text": {"type": "string"},
            "usage": {"type": "object"},
            "task": {"type": "string", "enum": ["transcribe", "translate"]},
            "language": STRING_OR_NULL,
            "duration": {"type": ["number", "null"]},
            "segments": {"type": "array", "items": {"type": "object", "required": ["id", "start", "end", "text"]}},
            "words": {"type": "array", "items": {"type": "object", "required": ["word", "start", "end"]}},
        },
    },
}


def _json(name: str) -> dict[str, Any]:
    return {"application/json": {"schema": {"$ref": f"#/components/schemas/{name}"}}}
REQUEST_TIMEOUT = {
    "name": "X-Request-Timeout",
    "in": "header",
    "required": False,
    "description": "seconds the request may run, at most the server's --request-timeout (504 past it)",
    "schema": {"type": "number", "exclusiveMinimum": 0},
}


def _form(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    schema = {"type": "object", "required": required, "properties": properties}
    return {"required": True, "content": {"multipart/form-data": {"schema": schema}}}


AUDIO_TO_TEXT_FORM = _form(
    {
        "file": {**BINARY, "description": "the audio: wav, flac, mp3, ogg... at any sample rate"},
        "model": {"type": "string", "minLength": 1},
        "language": TEXT,
        "prompt": TEXT,
        "response_format": {"type": "string", "enum": list(TRANSCRIPTION_FORMATS), "default": "json"},
        "temperature": {"type": "number"},
        "timestamp_granularities[]": {"type": "array", "items": {"type": "string", "enum": ["segment", "word"]}},
        "stream": {"type": "boolean", "default": False},
    },
    ["file", "model"],
)
AUDIO_TO_TEXT = {
    **_json("Transcription"),  # json, verbose_json
    "text/plain": {"schema": TEXT},  # text, srt
    "text/vtt": {"schema": TEXT},
    **SSE,  # stream=true
}
VOICE_FORM = _form(
    {
        "name": {"type": "string", "pattern": r"^\w[\w .-]{0,63}$", "description": "unique"},
        "file": {**BINARY, "description": "the reference audio"},
        "text": {"type": "string", "minLength": 1, "description": "what the reference audio says"},
    },
    ["name", "file", "text"],
)

# (method, path) -> what only the operation knows: its success answers, a body FastAPI cannot
# see, and the errors of its own ("runs": through the pipeline, so admission, stages, deadlines)
OPERATIONS: dict[tuple[str, str], dict[str, Any]] = {
    ("post", "/v1/audio/speech"): {"content": {**AUDIO, **SSE}, "headers": SAMPLE_RATE, "errors": ["404"], "runs": True},
    ("post", "/v1/audio/transcriptions"): {"content": AUDIO_TO_TEXT, "body": AUDIO_TO_TEXT_FORM, "errors": ["404"], "runs": True},
    ("post", "/v1/audio/translations"): {"content": AUDIO_TO_TEXT, "body": AUDIO_TO_TEXT_FORM, "errors": ["404"], "runs": True},
    ("post", "/v1/chat/completions"): {"content": {**JSON, **SSE}, "errors": ["404"], "runs": True},
    ("get", "/v1/audio/voices"): {"content": _json("VoiceList")},
    ("post", "/v1/audio/voices"): {"content": _json("Voice"), "body": VOICE_FORM, "errors": ["400"]},
    ("delete", "/v1/audio/voices/{voice_id}"): {"content": _json("DeletedVoice"), "errors": ["400", "404"]},
    ("get", "/v1/models"): {"content": _json("ModelList")},
    ("get", "/v1/models/{model_id}"): {"content": _json("Model"), "errors": ["404"]},
    ("get", "/health"): {"content": _json("Health"), "also": {"503": (
        "loading, draining or failed (`status`, `error`); past --max-connections, an error",
        {"application/json": {"schema": {"anyOf": [{"$ref": "#/components/schemas/Health"}, ERROR]}}},
    )}},
    ("get", "/metrics"): {"content": {"text/plain": {"schema": TEXT}}},
}


def describe(schema: dict[str, Any], *, keyed: bool, open_paths: Collection[str]) -> dict[str, Any]:
    """``schema`` (FastAPI's document) rewritten to say what the server answers. ``keyed``: the
    server has an API key, which every path but ``open_paths`` needs."""
    components = schema.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    schemas.pop("HTTPValidationError", None)
    schemas.pop("ValidationError", None)
    schemas["Error"] = ERROR_SCHEMA
    schemas.update(BODIES)
    if keyed:
        components["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    for path, operations in schema.get("paths", {}).items():
        for method, operation in operations.items():
            known = OPERATIONS.get((method, path), {})  # unknown: the rules only (the test names it)
            _describe_operation(operation, known, behind_key=keyed and path not in open_paths)
    return schema


def _describe_operation(operation: dict[str, Any], known: dict[str, Any], *, behind_key: bool) -> None:
    if "body" in known:
        operation["requestBody"] = known["body"]
    if known.get("runs"):
        operation["parameters"] = [*operation.get("parameters", []), REQUEST_TIMEOUT]
    responses = operation.setdefault("responses", {})
    responses.pop("422", None)
    success = responses.setdefault("200", {"description": "Successful Response"})
    if "content" in known:
        success["content"] = known["content"]
    if "headers" in known:
        success["headers"] = known["headers"]
    takes_input = "requestBody" in operation or bool(operation.get("parameters"))
    errors = set(known.get("errors", ()))
    errors.add("503")  # a connection past --max-connections, on any path
    if behind_key:
        errors.add("401")
        operation["security"] = [{"bearer": []}]
    if takes_input:
        errors.add("400")
    if "requestBody" in operation:
        errors |= {"408", "413"}
    if known.get("runs"):
        errors |= {"429", "500", "504"}  # and 503 for a stage being restarted
    for status in sorted(errors):
        response: dict[str, Any] = {"description": ERRORS[status], "content": {"application/json": {"schema": ERROR}}}
        if status in ("429", "503"):
            response["headers"] = RETRY_AFTER
        responses[status] = response
    for status, (description, content) in known.get("also", {}).items():
        responses[status] = {"description": description, "content": content}


def install_openapi(app: FastAPI, *, keyed: bool, open_paths: Collection[str]) -> Callable[[], dict[str, Any]]:
    """Makes ``app.openapi`` (what /openapi.json serves) return the described document, made once."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            generated = get_openapi(
                title=app.title, version=app.version, openapi_version=app.openapi_version, routes=app.routes
            )
            app.openapi_schema = describe(generated, keyed=keyed, open_paths=open_paths)
        return app.openapi_schema

    app.openapi = openapi
    return openapi
