"""A request's deadline: the server's ``--request-timeout`` (its maximum) or less, asked for with
the ``X-Request-Timeout`` header; counted from when the request has arrived whole."""

from __future__ import annotations

import math

from omni_core.serve.errors import APIError

HEADER = "X-Request-Timeout"


def request_timeout(header: str | None, maximum: float | None) -> float | None:
    """Seconds the request may run: the header's value (seconds, a positive number) bounded by
    ``maximum`` (None: the server sets no limit); without the header, ``maximum``."""
    if header is None or not header.strip():
        return maximum
    try:
        seconds = float(header)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds <= 0:
        raise APIError(
            400,
            f"{HEADER} must be a positive number of seconds, got {header[:40]!r}",
            param=HEADER,
            code="invalid_request_timeout",
        )
    return seconds if maximum is None else min(seconds, maximum)


def deadline_exceeded() -> APIError:
    return APIError(
        504,
        f"the request ran past its deadline (the server's --request-timeout, or {HEADER} where "
        "sent) and was stopped in every stage",
        type="server_error",
        code="deadline_exceeded",
    )
