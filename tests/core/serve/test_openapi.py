"""The API description says what the server does, for every route of the app (read from its
router, so a route added later is checked too): no 422 (validation errors are 400), the errors
each operation can answer in OpenAI's shape, the multipart bodies FastAPI cannot see, and the
media types of what succeeds. test_openapi_conformance.py holds real servers to it."""

from __future__ import annotations

import pytest
from fastapi.routing import APIRoute
from omni_core.serve.app import create_app
from omni_core.serve.openapi import OPERATIONS
from omni_core.serve.state import ServeConfig

try:  # FastAPI 0.16x keeps included routers whole in app.routes
    from fastapi.routing import iter_route_contexts
except ImportError:  # earlier ones copy their routes there
    iter_route_contexts = list

ERROR_REF = {"$ref": "#/components/schemas/Error"}


def document(**config) -> dict:
    app = create_app(ServeConfig(family="testfamily", served_model_name="testfamily", **config), loader=lambda: None)
    return app.openapi()


def described_operations() -> list[tuple[str, str]]:
    """(method, path) of every route the app puts in its API description."""
    app = create_app(ServeConfig(family="testfamily", served_model_name="testfamily"), loader=lambda: None)
    operations = []
    for route in iter_route_contexts(app.routes):
        if getattr(route, "include_in_schema", False) and isinstance(getattr(route, "route", route), APIRoute):
            operations += [(method.lower(), route.path) for method in sorted(route.methods)]
    return operations


def test_every_route_is_described_and_only_those():
    operations = described_operations()
    assert ("post", "/v1/audio/speech") in operations and ("get", "/metrics") in operations
    missing = [op for op in operations if op not in OPERATIONS]
    assert not missing, f"describe these in omni_core.serve.openapi.OPERATIONS: {missing}"
    assert sorted(OPERATIONS) == sorted(operations)  # nothing described that is not served
    paths = document()["paths"]
    assert sorted((m, p) for p, ops in paths.items() for m in ops) == sorted(operations)


@pytest.mark.parametrize("keyed", [False, True], ids=["no key", "api key"])
def test_errors_are_declared_in_openai_shape_and_never_422(keyed):
    doc = document(api_key="secret" if keyed else None)
    assert "HTTPValidationError" not in doc["components"]["schemas"]
    error = doc["components"]["schemas"]["Error"]["properties"]["error"]
    assert error["required"] == ["message", "type", "param", "code"]
    for path, operations in doc["paths"].items():
        for method, operation in operations.items():
            responses = operation["responses"]
            assert "422" not in responses, (method, path)
            assert "503" in responses, (method, path)  # past --max-connections, on any path
            assert ("401" in responses) == (keyed and path not in ("/health", "/metrics")), (method, path)
            if operation.get("requestBody") or operation.get("parameters"):
                assert "400" in responses, (method, path)
            if operation.get("requestBody"):
                assert {"408", "413"} <= set(responses), (method, path)
            for status, response in responses.items():
                if status != "200" and path != "/health":
                    assert response["content"] == {"application/json": {"schema": ERROR_REF}}, (method, path, status)


def test_runs_through_the_pipeline_so_may_be_refused_fail_or_time_out():
    paths = document()["paths"]
    for path in ("/v1/audio/speech", "/v1/audio/transcriptions", "/v1/audio/translations", "/v1/chat/completions"):
        assert {"404", "429", "500", "503", "504"} <= set(paths[path]["post"]["responses"]), path
    assert "429" not in paths["/v1/audio/voices"]["post"]["responses"]  # a save takes no running slot
    assert "Retry-After" in paths["/v1/audio/speech"]["post"]["responses"]["429"]["headers"]
    assert [p["name"] for p in paths["/v1/chat/completions"]["post"]["parameters"]] == ["X-Request-Timeout"]


def test_multipart_endpoints_declare_their_forms():
    paths = document()["paths"]
    for path, required in (
        ("/v1/audio/transcriptions", ["file", "model"]),
        ("/v1/audio/translations", ["file", "model"]),
        ("/v1/audio/voices", ["name", "file", "text"]),
    ):
        form = paths[path]["post"]["requestBody"]["content"]["multipart/form-data"]["schema"]
        assert form["required"] == required, path
        assert form["properties"]["file"] == {**form["properties"]["file"], "type": "string", "format": "binary"}
    transcription = paths["/v1/audio/transcriptions"]["post"]["requestBody"]["content"]["multipart/form-data"]
    assert transcription["schema"]["properties"]["response_format"]["enum"] == ["json", "text", "srt", "vtt", "verbose_json"]


def test_success_media_types():
    paths = document()["paths"]
    speech = paths["/v1/audio/speech"]["post"]["responses"]["200"]
    assert set(speech["content"]) == {"audio/mpeg", "audio/ogg", "audio/flac", "audio/wav", "audio/pcm", "text/event-stream"}
    assert "X-Sample-Rate" in speech["headers"]
    transcription = paths["/v1/audio/transcriptions"]["post"]["responses"]["200"]["content"]
    assert set(transcription) == {"application/json", "text/plain", "text/vtt", "text/event-stream"}
    assert set(paths["/v1/chat/completions"]["post"]["responses"]["200"]["content"]) == {"application/json", "text/event-stream"}
    assert set(paths["/metrics"]["get"]["responses"]["200"]["content"]) == {"text/plain"}
    assert set(paths["/health"]["get"]["responses"]) == {"200", "503"}
    for path, body in (("/v1/models", "ModelList"), ("/v1/audio/voices", "VoiceList"), ("/health", "Health")):
        assert paths[path]["get"]["responses"]["200"]["content"]["application/json"]["schema"] == {"$ref": f"#/components/schemas/{body}"}


def test_the_key_is_a_bearer_security_scheme_on_the_routes_behind_it():
    doc = document(api_key="secret", metrics_require_key=True)
    assert doc["components"]["securitySchemes"] == {"bearer": {"type": "http", "scheme": "bearer"}}
    assert doc["paths"]["/metrics"]["get"]["security"] == [{"bearer": []}]  # --metrics-require-key
    assert "security" not in doc["paths"]["/health"]["get"]
    assert "securitySchemes" not in document()["components"]
