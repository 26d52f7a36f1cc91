"""One log format for every omni process: ``omni serve``, its stage processes, omni's loggers
and uvicorn's, through one handler on the root logger.

- ``text``: one line a record, never wrapped, ``2026-12-06T17:04:16.498Z INFO omni.serve: ...``
  (UTC); a traceback follows on its own lines.
- ``json``: one JSON object a line for log collectors: ``time``, ``level``, ``logger``,
  ``message``, ``pid``, and ``exception`` (the traceback) where there is one.

``configure`` puts the choice in the environment (``OMNI_LOG_FORMAT``, ``OMNI_LOG_LEVEL``), so
stage processes spawned afterwards log the same way (``configure_from_environment``).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time

FORMATS = ("text", "json")
FORMAT_ENV = "OMNI_LOG_FORMAT"
LEVEL_ENV = "OMNI_LOG_LEVEL"


def utc_time(record: logging.LogRecord) -> str:
    seconds = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
    return f"{seconds}.{int(record.msecs):03d}Z"


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = f"{utc_time(record)} {record.levelname} {record.name}: {record.getMessage()}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": utc_time(record),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "pid": record.process,
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def configure(level: str = "info", fmt: str = "text") -> None:
    """Log records of ``level`` and above to stderr in ``fmt``, replacing the root's handlers."""
    if fmt not in FORMATS:
        raise ValueError(f"log format {fmt!r}: choose one of {list(FORMATS)}")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    os.environ[FORMAT_ENV] = fmt
    os.environ[LEVEL_ENV] = level


def configure_from_environment() -> None:
    """In a stage process: log as the process that started it chose (nothing, if it did not)."""
    fmt = os.environ.get(FORMAT_ENV)
    if fmt in FORMATS:
        configure(os.environ.get(LEVEL_ENV, "info"), fmt)
