"""One turn's life on the server, from its intake to its relayed answer: placed (a lease or the
scheduler, :class:`~luftpause.dataplane.link.placement.Placement`), forwarded and relayed
(:class:`~luftpause.dataplane.relay.loop.Relay`), sent once more to another replica when its own
failed before answering (docs/failover.md), all of it raced against the client leaving.

The race (starlette's habit): granian's ``receive()`` returning ``http.disconnect`` cancels this
very task, so a held turn leaves the queue at once and a streaming one closes its engine request
at once; ``send()`` is never relied on to notice (granian does not raise on a closed connection).
The watch costs two crossings into granian, so it begins only once the turn has lasted
``WATCH_AFTER_S``, or as soon as the turn must wait for the scheduler.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from luftpause.config import FailoverConfig
from luftpause.dataplane.asgi import WATCH_AFTER_S, Exchange, StreamBroken
from luftpause.dataplane.errors import DataplaneError, EngineUnreachable
from luftpause.dataplane.link.placement import Placement
from luftpause.dataplane.link.replicas import Replicas
from luftpause.dataplane.observe.metrics import DataplaneMetrics
from luftpause.dataplane.relay import turn_spans
from luftpause.dataplane.relay.loop import FailOver, Relay
from luftpause.dataplane.turn import Admitted, Relayed, Turn
from luftpause.observe import tracing

if TYPE_CHECKING:
    from opentelemetry.trace import Span

__all__ = ["TurnRunner"]

log = logging.getLogger("luftpause.dataplane")


class TurnRunner:
    """``TurnRunner(placement, relay, metrics, replicas, failover, server_address)``: ``replicas``
    says where the scheduler's replica names lead, as they are now (its set replaces them);
    ``server_address`` is the dataplane's own (host, port), for the turn's span."""

    def __init__(
        self,
        placement: Placement,
        relay: Relay,
        metrics: DataplaneMetrics,
        replicas: Replicas,
        failover: FailoverConfig,
        server_address: tuple[str, int] | None = None,
    ) -> None:
        self.placement = placement
        self.relay = relay
        self.metrics = metrics
        self._replicas = replicas
        self.failover = failover
        self._server_address = server_address

    async def run(self, turn: Turn, exchange: Exchange) -> None:
        """Admit ``turn``, forward it and relay its answer, racing the client leaving."""
        loop = asyncio.get_running_loop()
        task = asyncio.current_task(loop)
        assert task is not None
        left = False

        def gone() -> None:
            nonlocal left
            left = True
            task.cancel()

        def watch() -> None:
            exchange.watch(gone)

        later = loop.call_later(WATCH_AFTER_S, watch)
        span = None
        if tracing.active:
            # This turn's span parents what it sends on: the scheduler's admit and the engine request.
            span = turn_spans.start(turn, self._server_address)
            sent_on = tracing.headers_of(span)
            if sent_on:  # the client's tracestate rides on in the span's context
                turn = turn.traced(sent_on[tracing.TRACEPARENT], sent_on.get(tracing.TRACESTATE))
        try:
            await self._place_and_forward(turn, exchange, watch, span)
        except asyncio.CancelledError:
            if not left:
                raise  # cancelled from outside (the worker stopping), not by the client leaving
            task.uncancel()  # the client left: nobody to answer, nothing more to do
            if span is not None:
                span.set_attribute("luftpause.client_left", True)
        except DataplaneError as exc:
            exc.run_id = turn.run_id or None
            if span is not None:
                turn_spans.refused(span, exc.status, str(exc))
            raise
        except StreamBroken:
            raise  # the answer began (the span has the failure): granian aborts the connection
        except Exception as exc:
            # A fault of ours: answered 500 as any other, still naming the turn's run.
            log.error("turn %s failed", turn.turn_id, exc_info=exc)
            error = DataplaneError(f"internal error: {type(exc).__name__}")
            error.run_id = turn.run_id or None
            if span is not None:
                turn_spans.refused(span, error.status, str(error))
            raise error from None
        finally:
            later.cancel()
            exchange.unwatch()
            if span is not None:
                span.end()

    async def _place_and_forward(
        self, turn: Turn, exchange: Exchange, watch: Callable[[], None], span: Span | None
    ) -> Relayed:
        """Place ``turn``, forward it, and send it once more to another replica when its own
        failed before answering (at most once: :class:`~luftpause.dataplane.turn.Admitted`'s
        ``failovers_left``). What the relay saw of its last send."""
        placement = self.placement
        name = placement.leased(turn)
        if name is None:
            watch()  # the turn may be held: its client leaving must take it out of the queue at once
            name, turn = await placement.admit(turn, span=span)
        failovers_left = 1 if self.failover.undelivered or self.failover.retry_statuses else 0
        failover_from = ""
        while True:
            replica = self._replicas.by_name.get(name)
            if replica is None:
                placement.abandoned(turn, span)
                self.metrics.turn_ended("failed", turn.service_class)
                raise DataplaneError(
                    f"the scheduler placed the turn on replica {name!r}, "
                    "which this dataplane's configuration does not name"
                )
            admitted = Admitted(turn, replica, failovers_left, failover_from)
            try:
                return await self.relay.forward(admitted, exchange, span)
            except FailOver as exc:
                # Nothing reached the client and the turn was reported failed (with its replica
                # unreachable, the scheduler has taken that one out of rotation): it is admitted
                # again, through the scheduler (never a lease), to go to another replica.
                turn, failovers_left, failover_from = turn.again(), failovers_left - 1, replica.name
                self.metrics.failed_over("unreachable" if exc.unreachable else "status")
                log.warning(
                    "turn of run %s: %s; admitted again as turn %s for another replica",
                    turn.run_id,
                    exc,
                    turn.turn_id,
                    extra={"run_id": turn.run_id, "turn_id": turn.turn_id, "replica": replica.name},
                )
                watch()
                try:
                    name, turn = await placement.admit(turn, failover_from, span)
                except DataplaneError as refused:
                    if refused.status != 502:
                        raise
                    # no other replica: the client hears what happened to its turn first
                    raise EngineUnreachable(f"{exc}; {refused}") from None
