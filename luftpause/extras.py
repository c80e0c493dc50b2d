"""The optional extras (``pip install 'luftpause[NAME]'``) and the error when one is missing.

The core install serves turns and runs; an extra adds what only some commands need:

* ``otel``: the OpenTelemetry SDK and its OTLP exporters (HTTP and gRPC), for exporting spans
  (:mod:`luftpause.observe.tracing`, with ``OTEL_EXPORTER_OTLP_ENDPOINT`` set). The API alone is core:
  without the SDK every span is the API's no-op.
* ``tui``: ``rich``, for the terminal views of ``luftpause top`` and ``luftpause loadgen``.

A module that needs an extra imports it under a guard that raises :class:`MissingExtra`, where it
draws (:func:`require_tui`), so that a command drawing nothing (``loadgen --json``, ``top
--once``) runs without it; the CLI prints its one line and exits 2 (:func:`luftpause.cli.main`).
"""

from __future__ import annotations


class MissingExtra(ImportError):
    """``what`` needs a module of extra ``extra`` that is not installed.

    An ``ImportError`` (``name`` is the missing module), so library callers catching that still do;
    ``str()`` is one line naming the extra to install, e.g. ``its terminal view needs rich, which
    is not installed: pip install 'luftpause[tui]'`` (the CLI puts ``luftpause top:`` before it).
    """

    def __init__(self, extra: str, what: str, missing: ImportError) -> None:
        module = missing.name or "a module"
        super().__init__(
            f"{what} needs {module}, which is not installed: pip install 'luftpause[{extra}]'",
            name=missing.name,
        )
        self.extra = extra


def require_tui(what: str) -> None:
    """Raise :class:`MissingExtra` naming ``what`` (``"its summary table"``) when ``rich`` (the
    ``tui`` extra) cannot be imported; return quietly when it can."""
    try:
        import rich  # noqa: F401
    except ImportError as exc:
        raise MissingExtra("tui", what, exc) from None
