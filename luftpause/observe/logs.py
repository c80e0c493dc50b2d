"""Logging for every luftpause process: plain text by default, one JSON object per line on request.

``luftpause --log-format json COMMAND ...`` (or ``LUFTPAUSE_LOG_FORMAT=json``) makes every record a
JSON object on its own line (``python-json-logger``), with the keys ``time`` (ISO 8601 in UTC with
milliseconds, e.g. ``2026-03-01T12:00:00.123Z``), ``level``, ``logger``, ``process`` (the command:
``scheduler``, ``dataplane``, ...) and ``message``, plus ``exc_info`` for an exception and any
``extra={...}`` fields the call gave. The choice travels in the environment, so ``luftpause up``'s
children and granian's worker processes log the same way. granian's own records (``_granian``) go
through the same formatter, on stderr. A process's one-line "serving on ..." announcement goes
through :func:`announce`: printed as plain text by default, a log record (logger
``luftpause.<command>``) in JSON mode, so every line a process writes in JSON mode is one JSON
object. Text mode keeps the ``asctime`` of :mod:`logging` (local time), and ends the line of a
record that carries a non-empty ``trace_id`` field with `` trace=<trace id>``, so that a turn's
trace can be found from the default log as well. The HTTP client libraries' per-request lines
(``HTTP Request: POST ... "HTTP/1.1 200 OK"`` from httpx and httpx2, one per MCP message) are
kept out unless DEBUG is asked for: see :data:`PER_REQUEST_LOGGERS`.

``luftpause --log-level debug|info|warning|error COMMAND ...`` (or ``LUFTPAUSE_LOG_LEVEL``; default
``info``) sets the level the same way: it travels in the environment to ``luftpause up``'s children
and to granian's workers, and ``debug`` lets the HTTP clients' per-request lines through.
"""

from __future__ import annotations

import logging
import os
import sys
from datetime import UTC, datetime
from typing import IO, Any, Literal

from pythonjsonlogger.json import JsonFormatter

LOG_FORMAT_ENV = "LUFTPAUSE_LOG_FORMAT"
FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"

LogFormat = Literal["text", "json"]

LOG_LEVEL_ENV = "LUFTPAUSE_LOG_LEVEL"
# The words --log-level and LUFTPAUSE_LOG_LEVEL take, and the logging level each names.
LEVELS: dict[str, int] = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}

# Loggers that write a line per HTTP request: httpx and httpx2 (the mcp SDK's client) at INFO,
# httpcore and httpcore2 at DEBUG (`loadgen --spawn` printed one line per MCP message). aiohttp's and
# uvicorn's access logs are not here: every luftpause server turns its access log off.
PER_REQUEST_LOGGERS = ("httpx", "httpx2", "httpcore", "httpcore2")


def current_format() -> LogFormat:
    """The format ``LUFTPAUSE_LOG_FORMAT`` asks for; ``text`` when unset or unknown."""
    return "json" if os.environ.get(LOG_FORMAT_ENV, "").strip().lower() == "json" else "text"


def current_level() -> int:
    """The :mod:`logging` level ``LUFTPAUSE_LOG_LEVEL`` asks for (a word of :data:`LEVELS`);
    ``logging.INFO`` when unset or unknown."""
    return LEVELS.get(os.environ.get(LOG_LEVEL_ENV, "").strip().lower(), logging.INFO)


class _ProcessField(logging.Filter):
    """Adds ``luftpause_process`` (the luftpause command; the JSON key ``process``) to every record."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.command = name

    def filter(self, record: logging.LogRecord) -> bool:
        record.luftpause_process = self.command
        return True


class _UtcJsonFormatter(JsonFormatter):
    """``JsonFormatter`` whose ``time`` is UTC ISO 8601 with milliseconds and a ``Z``."""

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        moment = datetime.fromtimestamp(record.created, UTC)
        return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def json_formatter() -> logging.Formatter:
    """The one-object-per-line formatter (keys in the module docstring)."""
    return _UtcJsonFormatter(
        "%(asctime)s %(levelname)s %(name)s %(luftpause_process)s %(message)s",
        rename_fields={
            "asctime": "time",
            "levelname": "level",
            "name": "logger",
            "luftpause_process": "process",
        },
    )


def announce(command: str, message: str, *, level: int = logging.INFO, stream: IO[str] | None = None) -> None:
    """Say ``message`` (one line: what the process serves, or why it cannot start).

    Text mode: printed as is on ``stream`` (default stdout), as the tests and ``luftpause up``
    read it. JSON mode: a record of logger ``luftpause.<command>`` at ``level``, handled whatever
    that logger's level (an announcement is never filtered out, as the printed line was not).
    """
    if current_format() != "json":
        print(message, file=stream if stream is not None else sys.stdout, flush=True)
        return
    logger = logging.getLogger(f"luftpause.{command}")
    logger.handle(logger.makeRecord(logger.name, level, __file__, 0, message, (), None))


def configure(command: str, level: int | None = None) -> None:
    """Route the root logger to stderr in the current format (see :func:`current_format`), at
    ``level`` (default: :func:`current_level`).

    ``command`` names the process in JSON records. Safe to call again (the worker process of a
    granian server calls it once more): handlers are replaced, never added twice. The
    :data:`PER_REQUEST_LOGGERS` are set to WARNING unless ``level`` is DEBUG.
    """
    if level is None:
        level = current_level()
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(_ProcessField(command))
    handler.setFormatter(json_formatter() if current_format() == "json" else _text_formatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    for name in PER_REQUEST_LOGGERS:
        logging.getLogger(name).setLevel(level if level <= logging.DEBUG else logging.WARNING)


class _TextFormatter(logging.Formatter):
    """:data:`TEXT_FORMAT`, plus `` trace=<id>`` for a record with a ``trace_id`` field."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        line = super().formatMessage(record)
        trace_id = getattr(record, "trace_id", "")
        return f"{line} trace={trace_id}" if trace_id else line


def _text_formatter() -> logging.Formatter:
    return _TextFormatter(TEXT_FORMAT)


def granian_log_config(command: str, level: int | None = None) -> dict[str, Any]:
    """``Granian(log_dictconfig=...)``: granian applies it in its main process and in every worker,
    so granian's own records and luftpause's in the worker (the root logger) share the format and
    the root's ``level`` (default: :func:`current_level`)."""
    if level is None:
        level = current_level()
    formatter = json_formatter if current_format() == "json" else _text_formatter
    handler = {"filters": ["process"], "class": "logging.StreamHandler", "stream": "ext://sys.stderr"}
    return {
        "formatters": {"generic": {"()": formatter}, "access": {"()": formatter}},
        "filters": {"process": {"()": _ProcessField, "name": command}},
        "handlers": {
            "console": {"formatter": "generic", **handler},
            "access": {"formatter": "access", **handler},
        },
        "root": {"handlers": ["console"], "level": logging.getLevelName(level)},
    }
