"""Errors in OpenAI's JSON shape: ``{"error": {"message", "type", "param", "code"}}``.

Route code raises ``APIError`` (or one of the helpers below); ``install_error_handlers`` turns it,
FastAPI's validation errors and anything unexpected into a JSON body with the right status, so
no request can take the server down with it.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from omni_core.serve.exceptions import InputTooLarge, InvalidInput

log = logging.getLogger("omni.serve")


class APIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


class StreamCut(Exception):
    """The server ends a raw stream before its end (a stage failed, a drain aborted it): raised
    out of the response, so that the server closes the connection with the chunked body
    unterminated, which is how a raw stream says "incomplete". The response logs it in one line
    (``SlotStreamingResponse``), so neither the error handler below nor the server (uvicorn,
    through ``QuietStreamCuts``) logs its traceback again."""

    def __init__(self, message: str, level: int = logging.WARNING):
        super().__init__(message)
        self.level = level


class QuietStreamCuts(logging.Filter):
    """For uvicorn's error log: drops its "Exception in ASGI application" of a ``StreamCut``."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], StreamCut))


def unknown_model(name: str, served: str) -> APIError:
    return APIError(
        404,
        f"The model {name!r} does not exist; this server serves {served!r}.",
        param="model",
        code="model_not_found",
    )


def from_invalid_input(exc: InvalidInput) -> APIError:
    status = 413 if isinstance(exc, InputTooLarge) else 400
    return APIError(status, exc.message, param=exc.param, code=exc.code)


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    errors = exc.errors()
    if not errors:
        return "invalid request", None
    first = errors[0]
    if first.get("type") == "json_invalid":
        return f"the body is not valid JSON: {first.get('ctx', {}).get('error', 'parse error')}", None
    loc = [str(part) for part in first.get("loc", ()) if part not in ("body", "query", "form")]
    param = ".".join(loc) or None
    message = first.get("msg", "invalid value")
    return (f"{param}: {message}" if param else message), param


def allowed_methods(request: Request) -> str:
    """Every method some route takes on the request's path: Starlette's own 405 names only those
    of the first route with the path, where a path served by several routes (GET and POST
    /v1/audio/voices) has more."""
    methods = []
    for method in ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"):
        probe = {**request.scope, "method": method}
        if any(route.matches(probe)[0] == Match.FULL for route in request.app.router.routes):
            methods.append(method)
    return ", ".join(methods)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):
        return exc.response()

    @app.exception_handler(InvalidInput)
    async def _invalid_input(request: Request, exc: InvalidInput):
        return from_invalid_input(exc).response()

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError):
        message, param = _validation_message(exc)
        return APIError(400, message, param=param).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException):
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        # keeps what the status needs said (a 405's Allow)
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            headers["Allow"] = allowed_methods(request)
        return APIError(exc.status_code, str(exc.detail), type=kind, headers=headers).response()

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception):
        if isinstance(exc, StreamCut):  # logged already; its response has started: nothing to send
            return APIError(500, str(exc), type="server_error").response()
        log.exception("unexpected error on %s", request.url.path)
        return APIError(500, f"internal error: {type(exc).__name__}: {exc}", type="server_error").response()
