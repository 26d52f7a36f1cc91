"""GET /v1/models, /health and /metrics. Readiness is one story: while the model loads (or after
it failed to load, or while the server drains) /health and /v1/models both answer 503."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from omni_core.serve.errors import APIError

router = APIRouter()  # /v1 routes: behind the API key
open_router = APIRouter()  # probes and scraping stay open


def _model_card(state) -> dict:
    omni = state.omni
    return {
        "id": state.config.served_model_name,
        "object": "model",
        "created": state.created,
        "owned_by": "omni",
        "family": state.config.family,
        "tasks": list(omni.tasks) if omni else [],
        "root": omni.checkpoint_dir if omni else None,
    }


@router.get("/v1/models")
async def list_models(request: Request):
    state = request.app.state.omni_state
    state.ready_omni()  # 503 until the model serves, as /health
    return {"object": "list", "data": [_model_card(state)]}


@router.get("/v1/models/{model_id}")
async def get_model(model_id: str, request: Request):
    state = request.app.state.omni_state
    state.ready_omni()
    if model_id != state.config.served_model_name:
        raise APIError(
            404,
            f"The model {model_id!r} does not exist",
            type="not_found_error",
            param="model",
            code="model_not_found",
        )
    return _model_card(state)


@open_router.get("/health")
async def health(request: Request):
    state = request.app.state.omni_state
    status = state.status
    body = {"status": status, "running": state.admission.running, "queued": state.admission.queued}
    if state.error:
        body["error"] = state.error
    return JSONResponse(body, status_code=200 if status == "ready" else 503)


@open_router.get("/metrics")
async def metrics(request: Request):
    return Response(request.app.state.omni_state.metrics.render(), media_type=CONTENT_TYPE_LATEST)
