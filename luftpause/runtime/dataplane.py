"""The runtime's one client of the dataplane: a run's LLM turns, ``decide``'s classifications and
the ends of runs, all through one ``httpx2.AsyncClient``.

Requests (the OpenAI chat completions API, non-streamed; vLLM's classification request; the
dataplane's own run end, docs/architecture.md "The dataplane")::

    POST   {dataplane}/v1/chat/completions   a turn: x-luftpause-run-id, -class, -caller headers
    POST   {dataplane}/v1/decide             a single-pass classification
    DELETE {dataplane}/v1/runs/{handle}      the run ended: the scheduler may forget it

With ``LUFTPAUSE_TOKEN`` set every request carries ``Authorization: Bearer <token>``
(docs/architecture.md "Auth").

The test seam is httpx's: ``transport=`` (an ``httpx2.MockTransport`` answering from a function,
an ``httpx2.ASGITransport`` serving an app in-process); by default the client speaks HTTP to
``[runtime] dataplane``.

Timeouts and pooling: a turn may take :data:`TURN_TIMEOUT_SECONDS` (600 s) in total, queue wait at
the dataplane included, and nothing below may cut it shorter: connect, read, write and pool
timeouts are that long too, the whole request is bounded by it, and the pool has no connection
cap, because a held turn keeps its connection open while the dataplane queues it, so a pool wait
could otherwise eat into the turn. A request the caller cancels (a run cancelled mid-turn) closes
its connection, which is how the dataplane learns to take the turn out of its queue or stop the
engine's generation.

Errors: :class:`~luftpause.runtime.errors.TurnFailed` for a turn,
:class:`~luftpause.runtime.errors.DataplaneFailed` for :meth:`DataplaneClient.post_json`; the
end of a run is best effort and never raises.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import ssl
from collections.abc import Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from types import TracebackType
from typing import Any

import httpx2

from luftpause.runtime.errors import DataplaneFailed, TurnFailed

log = logging.getLogger("luftpause.runtime.dataplane")

TURN_TIMEOUT_SECONDS = 600.0
"""One turn, queue wait at the dataplane included (docs/architecture.md "Constants": 10 min)."""

DEFAULT_RETRY_AFTER_SECONDS = 1.0
"""Wait after a 429 without a usable ``Retry-After`` header."""

CALLER_HEADER_MAX_BYTES = 128
"""Longest ``x-luftpause-caller`` value the dataplane keeps (docs/proxy.md, "Headers")."""

RUN_END_TIMEOUT_SECONDS = 5.0
"""Longest one ``DELETE /v1/runs/{handle}`` may take (seconds)."""

SHUTDOWN_END_RUNS_SECONDS = 2.0
"""Longest the runtime's shutdown spends ending the runs it interrupted, all together (seconds):
long enough for a live dataplane to answer thousands of them, short enough that a dead one does not
noticeably delay the shutdown (a supervisor's grace period is often 5-10 s)."""

_HEADER_SAFE = frozenset(chr(c) for c in range(0x21, 0x7F)) - {"%"}


def header_safe(value: str, max_bytes: int = CALLER_HEADER_MAX_BYTES) -> str:
    """``value`` as an ``x-luftpause-caller`` header value: printable ASCII but ``%`` as it is,
    every other character (non-ASCII, space, ``%``, control characters such as CR and LF) as
    the percent-encoded bytes of its UTF-8 (RFC 3986 section 2.1), cut to at most ``max_bytes``
    bytes on a character boundary; ``anonymous`` when nothing is left.

    Header values cross HTTP as latin-1 at best and the dataplane refuses a value that is not
    UTF-8, so raw UTF-8 cannot cross; ASCII crosses both unchanged. Nobody decodes it: the
    dataplane and the scheduler take the caller as an opaque id of at most 128 bytes (docs/proxy.md,
    "Headers"). An encoding is one-to-one, so two callers never share a fairness slot by it."""
    out: list[str] = []
    size = 0
    for ch in value:
        piece = (
            ch if ch in _HEADER_SAFE else "".join(f"%{b:02X}" for b in ch.encode("utf-8", "surrogatepass"))
        )
        if size + len(piece) > max_bytes:
            break
        out.append(piece)
        size += len(piece)
    return "".join(out) or "anonymous"


def retry_after_seconds(value: str | None, now: datetime | None = None) -> float:
    """How long to wait after a 429 whose ``Retry-After`` header is ``value`` (RFC 9110 section
    10.2.3: delay-seconds or an HTTP-date; fractional seconds are accepted too), in seconds.

    A date is counted from ``now`` (default: the current UTC time); a past date or a negative
    number means at once. No header, or one that is neither, means
    :data:`DEFAULT_RETRY_AFTER_SECONDS`. The wait is at most :data:`TURN_TIMEOUT_SECONDS`.
    """
    seconds = DEFAULT_RETRY_AFTER_SECONDS
    text = (value or "").strip()
    if text:
        try:
            number = float(text)
        except ValueError:
            try:
                when = parsedate_to_datetime(text)
            except (TypeError, ValueError, IndexError):
                when = None
            if when is not None:
                if when.tzinfo is None:  # RFC 9110 dates are GMT
                    when = when.replace(tzinfo=UTC)
                seconds = (when - (now or datetime.now(UTC))).total_seconds()
        else:
            if math.isfinite(number):
                seconds = number
    return min(max(seconds, 0.0), TURN_TIMEOUT_SECONDS)


def error_message(body: bytes) -> str:
    """The dataplane's own message in an error body (``{"error": {"message"}}``, or
    ``{"error": "..."}``), else the body's first 500 characters."""
    try:
        data = json.loads(body)
        message = data["error"]["message"] if isinstance(data.get("error"), dict) else data["error"]
        return str(message)
    except (ValueError, KeyError, TypeError, AttributeError):
        return body.decode("utf-8", "replace").strip()[:500]


def _answered(status: int, body: bytes, what: str = "dataplane") -> str:
    text = error_message(body)
    return f"{what} answered {status}: {text}" if text else f"{what} answered {status}"


def new_http_client(
    base_url: str,
    token: str | None = None,
    transport: httpx2.AsyncBaseTransport | None = None,
    verify: ssl.SSLContext | bool = True,
) -> httpx2.AsyncClient:
    """The ``httpx2.AsyncClient`` of :class:`DataplaneClient` (module docstring: timeouts and
    pooling); ``transport`` replaces the network (tests); ``verify``: an ``https://`` dataplane's
    TLS context (its CA, this runtime's client certificate; :mod:`luftpause.auth.tls`)."""
    return httpx2.AsyncClient(
        verify=verify,
        base_url=base_url.rstrip("/"),
        headers={"Authorization": f"Bearer {token}"} if token else None,
        timeout=httpx2.Timeout(TURN_TIMEOUT_SECONDS),
        limits=httpx2.Limits(max_connections=None, max_keepalive_connections=None),
        transport=transport,
        trust_env=False,  # a proxy from the environment must not sit between the runtime and its dataplane
    )


class DataplaneClient:
    """The runtime's side of the dataplane (module docstring). Use as an async context manager,
    or call :meth:`aclose`; one per runtime, shared by every run."""

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        *,
        transport: httpx2.AsyncBaseTransport | None = None,
        verify: ssl.SSLContext | bool = True,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.http = new_http_client(self.base_url, token, transport, verify)

    async def __aenter__(self) -> DataplaneClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self.http.aclose()

    async def complete(
        self,
        run_id: str,
        service_class: str,
        caller: str,
        body: dict[str, Any],
        headers: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """POST one non-streamed chat completion of run ``run_id`` (its class and caller as the
        scheduler's headers; ``headers`` added, e.g. the turn's ``traceparent``); the reply.

        A 429 is waited out (``Retry-After`` seconds, else 1 s) and retried until the caller is
        cancelled. Raises :class:`TurnFailed` for any other HTTP error status, a connection error,
        the 600 s turn timeout or a reply that is not a JSON object.
        """
        url = f"{self.base_url}/v1/chat/completions"
        sent = {
            "x-luftpause-run-id": run_id,
            "x-luftpause-class": service_class,
            "x-luftpause-caller": header_safe(caller),
            **(headers or {}),
        }
        while True:
            try:
                async with asyncio.timeout(TURN_TIMEOUT_SECONDS):
                    response = await self.http.post("/v1/chat/completions", json=body, headers=sent)
            except httpx2.TimeoutException as exc:
                raise TurnFailed(f"dataplane {url}: no reply within {TURN_TIMEOUT_SECONDS:.0f} s") from exc
            except TimeoutError as exc:
                raise TurnFailed(f"dataplane {url}: no reply within {TURN_TIMEOUT_SECONDS:.0f} s") from exc
            except httpx2.HTTPError as exc:
                raise TurnFailed(f"dataplane {url}: {exc or type(exc).__name__}") from exc
            if response.status_code == 429:
                await asyncio.sleep(retry_after_seconds(response.headers.get("Retry-After")))
                continue
            if response.status_code >= 400:
                raise TurnFailed(_answered(response.status_code, response.content))
            try:
                reply = json.loads(response.content)
            except ValueError as exc:
                raise TurnFailed(f"dataplane reply is not JSON: {exc}") from exc
            if not isinstance(reply, dict):
                raise TurnFailed("dataplane reply is not a JSON object")
            return reply

    async def post_json(
        self, path: str, body: dict[str, Any], headers: Mapping[str, str], *, within: float
    ) -> dict[str, Any]:
        """POST ``body`` to ``path``; the reply as a JSON object. A 429 is waited out after its
        ``Retry-After`` (else 1 s, as a run's turn is) and retried, all within ``within`` seconds.
        Raises :class:`DataplaneFailed` with the dataplane's status and message, a connection
        error, no answer in time, or a reply that is not a JSON object."""
        url = f"{self.base_url}/{path.lstrip('/')}"
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        while True:
            left = deadline - loop.time()
            if left <= 0:
                raise DataplaneFailed(f"dataplane {url}: no answer within {within:.0f} s")
            try:
                async with asyncio.timeout(left):
                    response = await self.http.post(url, json=body, headers=dict(headers))
            except (httpx2.TimeoutException, TimeoutError) as exc:
                raise DataplaneFailed(f"dataplane {url}: no answer within {within:.0f} s") from exc
            except httpx2.HTTPError as exc:
                raise DataplaneFailed(f"dataplane {url}: {exc or type(exc).__name__}") from exc
            if response.status_code == 429:
                delay = retry_after_seconds(response.headers.get("Retry-After"))
                if loop.time() + delay >= deadline:
                    raise DataplaneFailed(_answered(429, response.content, f"dataplane {path}"))
                await asyncio.sleep(delay)
                continue
            if response.status_code >= 400:
                raise DataplaneFailed(_answered(response.status_code, response.content, f"dataplane {path}"))
            break
        try:
            reply = json.loads(response.content)
        except ValueError as exc:
            raise DataplaneFailed(f"dataplane {path} answered something that is not JSON: {exc}") from exc
        if not isinstance(reply, dict):
            raise DataplaneFailed(f"dataplane {path} answered JSON that is not an object")
        return reply

    async def end_run(self, handle: str) -> bool:
        """``DELETE /v1/runs/{handle}``: the run ended, the scheduler may forget it.

        Best effort, at most :data:`RUN_END_TIMEOUT_SECONDS`: every error is logged and ignored.
        Returns whether the dataplane acknowledged it (a 2xx status).
        """
        try:
            async with asyncio.timeout(RUN_END_TIMEOUT_SECONDS):
                response = await self.http.delete(f"/v1/runs/{handle}")
        except (httpx2.HTTPError, TimeoutError) as exc:
            log.info("could not report the end of %s to the dataplane: %s", handle, exc or type(exc).__name__)
            return False
        if response.status_code >= 400:  # a 401 here means the tokens of the two processes differ
            log.warning(
                "the dataplane refused the end of %s: %s",
                handle,
                _answered(response.status_code, response.content),
            )
            return False
        return True

    async def end_runs(self, handles: list[str], seconds: float = SHUTDOWN_END_RUNS_SECONDS) -> int:
        """:meth:`end_run` for every handle, all at once, for at most ``seconds`` in total; the
        requests still open then are cancelled. Returns how many the dataplane acknowledged.
        Never raises (but for the caller's own cancellation)."""
        if not handles:
            return 0
        requests = [asyncio.ensure_future(self.end_run(handle)) for handle in handles]
        try:
            done, pending = await asyncio.wait(requests, timeout=seconds)
        finally:
            for request in requests:  # those still open; also when we are cancelled ourselves
                request.cancel()
        if pending:
            await asyncio.wait(pending)  # let the cancelled requests close their connections
        ended = sum(1 for request in done if not request.cancelled() and request.result())
        if ended < len(handles):
            log.warning(
                "%d of %d runs stopped by the shutdown could not be ended at the dataplane "
                "(%d unanswered after %.1f s); the scheduler forgets them after its run idle expiry",
                len(handles) - ended,
                len(handles),
                len(pending),
                seconds,
            )
        return ended
