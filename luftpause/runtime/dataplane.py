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

Transient failures (docs/architecture.md "The runtime's dataplane client"): a 429, 502 or 503
answer, or a dataplane that cannot be reached or drops the connection (refused, reset, closed
before its answer), is retried with capped, jittered exponential backoff (tenacity's full jitter:
a wait drawn between 0 and ``first_wait * 2**n`` seconds, at most ``max_wait``), for at most
:attr:`RetryPolicy.seconds` from the first try; a ``Retry-After`` header (429, 503) is waited
instead, up to :data:`RETRY_AFTER_CAP_SECONDS`. A wait that would end past the window is not
taken: the request fails with the last error and how long it was retried. A turn sent again is
an LLM call made again, never a tool call: nothing it answered had been taken into the run.

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
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from types import TracebackType
from typing import Any, TypeVar

import httpx2
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, stop_before_delay
from tenacity.wait import wait_random_exponential

from luftpause.runtime.errors import DataplaneFailed, TurnFailed

log = logging.getLogger("luftpause.runtime.dataplane")

T = TypeVar("T")

TURN_TIMEOUT_SECONDS = 600.0
"""One turn, queue wait at the dataplane included (docs/architecture.md "Constants": 10 min)."""

DEFAULT_RETRY_AFTER_SECONDS = 1.0
"""Wait after a 429 without a usable ``Retry-After`` header."""

RETRY_AFTER_CAP_SECONDS = 30.0
"""Longest one ``Retry-After`` is waited (seconds): a dataplane asking for longer is asked again
then, while the retry window lasts."""

TRANSIENT_STATUSES = frozenset({429, 502, 503})
"""Answers of the dataplane worth asking again: held back (429), no engine answered (502),
nothing to serve it now (503)."""

_UNREACHABLE = (httpx2.ConnectError, httpx2.ReadError, httpx2.WriteError, httpx2.RemoteProtocolError)
"""Transport errors of a dataplane that is down or restarting: refused, reset, closed early."""


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How long transient failures are retried (module docstring): ``seconds`` from the first
    try (``[runtime] turn_retry_seconds``; 0: never), each wait jittered up to ``first_wait *
    2**n`` seconds and at most ``max_wait`` (``[runtime] turn_retry_max_wait``)."""

    seconds: float = 120.0
    max_wait: float = 10.0
    first_wait: float = 0.25


class _Transient(Exception):
    """A failure worth retrying: its message, and the ``Retry-After`` the answer asked (seconds)."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


def _transient_answer(response: httpx2.Response, what: str) -> _Transient:
    header = response.headers.get("Retry-After")
    after = retry_after_seconds(header) if header is not None or response.status_code == 429 else None
    return _Transient(_answered(response.status_code, response.content, what), after)


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
        retry: RetryPolicy = RetryPolicy(),
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.http = new_http_client(self.base_url, token, transport, verify)
        self.retry = retry

    async def _retrying(self, attempt: Callable[[], Awaitable[T]], within: float, what: str) -> T:
        """``attempt()`` until it returns, retrying while it raises :class:`_Transient` (module
        docstring), for at most ``within`` seconds; the last transient failure is raised as
        :class:`DataplaneFailed` saying how long it was retried (the caller re-raises it as its own
        error)."""
        policy = self.retry
        backoff = wait_random_exponential(multiplier=policy.first_wait, max=policy.max_wait)

        def wait(state: RetryCallState) -> float:
            failed = state.outcome.exception() if state.outcome is not None else None
            if isinstance(failed, _Transient) and failed.retry_after is not None:
                return min(failed.retry_after, RETRY_AFTER_CAP_SECONDS)
            return float(backoff(state))

        def before_sleep(state: RetryCallState) -> None:
            failed = state.outcome.exception() if state.outcome is not None else None
            log.warning(
                "%s: %s; try %d failed, again in %.2f s",
                what,
                failed,
                state.attempt_number,
                state.upcoming_sleep,
            )

        retrying = AsyncRetrying(
            retry=retry_if_exception_type(_Transient),
            wait=wait,
            stop=stop_before_delay(within),
            before_sleep=before_sleep,
            reraise=True,
        )
        loop = asyncio.get_running_loop()
        began = loop.time()
        tries = 0
        try:
            async for each in retrying:
                with each:
                    tries += 1
                    return await attempt()
        except _Transient as exc:
            spent = loop.time() - began
            raise DataplaneFailed(f"{exc} (tried {tries} times in {spent:.1f} s)") from None
        raise AssertionError("unreachable: tenacity either returns, raises, or retries")

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

        A 429, 502 or 503, or a dataplane unreachable, is retried (module docstring) within
        :attr:`RetryPolicy.seconds`. Raises :class:`TurnFailed` with the last such error once the
        window is spent, for any other HTTP error status, the 600 s turn timeout or a reply that
        is not a JSON object.
        """
        url = f"{self.base_url}/v1/chat/completions"
        sent = {
            "x-luftpause-run-id": run_id,
            "x-luftpause-class": service_class,
            "x-luftpause-caller": header_safe(caller),
            **(headers or {}),
        }

        async def attempt() -> httpx2.Response:
            try:
                async with asyncio.timeout(TURN_TIMEOUT_SECONDS):
                    response = await self.http.post("/v1/chat/completions", json=body, headers=sent)
            except (httpx2.TimeoutException, TimeoutError) as exc:
                raise TurnFailed(f"dataplane {url}: no reply within {TURN_TIMEOUT_SECONDS:.0f} s") from exc
            except _UNREACHABLE as exc:
                raise _Transient(f"dataplane {url}: {exc or type(exc).__name__}") from exc
            except httpx2.HTTPError as exc:
                raise TurnFailed(f"dataplane {url}: {exc or type(exc).__name__}") from exc
            if response.status_code in TRANSIENT_STATUSES:
                raise _transient_answer(response, "dataplane")
            return response

        try:
            response = await self._retrying(attempt, self.retry.seconds, f"turn of {run_id}")
        except DataplaneFailed as exc:
            raise TurnFailed(str(exc)) from None
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
        """POST ``body`` to ``path``; the reply as a JSON object. A 429, 502 or 503, or a dataplane
        unreachable, is retried as a turn is (module docstring), all within ``within`` seconds
        (and the policy's window). Raises :class:`DataplaneFailed` with the dataplane's status and
        message (the last one, once retries are spent), no answer in time, or a reply that is not
        a JSON object."""
        url = f"{self.base_url}/{path.lstrip('/')}"
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within

        async def attempt() -> httpx2.Response:
            left = deadline - loop.time()
            if left <= 0:
                raise DataplaneFailed(f"dataplane {url}: no answer within {within:.0f} s")
            try:
                async with asyncio.timeout(left):
                    response = await self.http.post(url, json=body, headers=dict(headers))
            except (httpx2.TimeoutException, TimeoutError) as exc:
                raise DataplaneFailed(f"dataplane {url}: no answer within {within:.0f} s") from exc
            except _UNREACHABLE as exc:
                raise _Transient(f"dataplane {url}: {exc or type(exc).__name__}") from exc
            except httpx2.HTTPError as exc:
                raise DataplaneFailed(f"dataplane {url}: {exc or type(exc).__name__}") from exc
            if response.status_code in TRANSIENT_STATUSES:
                raise _transient_answer(response, f"dataplane {path}")
            return response

        response = await self._retrying(attempt, min(within, self.retry.seconds), f"{path}")
        if response.status_code >= 400:
            raise DataplaneFailed(_answered(response.status_code, response.content, f"dataplane {path}"))
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
