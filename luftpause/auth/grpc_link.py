"""The token on the dataplane-to-scheduler gRPC link (``luftpause.v1.Scheduler/Connect``).

With ``LUFTPAUSE_TOKEN`` set, every call must carry the metadata ``authorization: Bearer
<token>`` (gRPC's HTTP/2 mapping of the header of the same name); the scheduler's
:class:`TokenInterceptor` compares it in constant time and refuses any call without it with
``UNAUTHENTICATED`` (after reading its first message, which it drops) before the service sees
anything, so a stranger who reaches the port can neither report turns nor resync. The
dataplane's side is :class:`LinkCredentials`: the channel (TLS when
``[dataplane.scheduler_tls]`` is configured, :mod:`luftpause.auth.tls`) and the metadata of every
call. A dataplane refused so answers its waiting turns 503
(``scheduler failed: UNAUTHENTICATED: ...``) and keeps retrying every second.

Without TLS the token crosses the wire in clear: fine on loopback or a private network, and
what ``[scheduler.tls]`` is for otherwise.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import grpc.aio

from luftpause.auth.tls import grpc_channel_credentials
from luftpause.auth.tokens import REFUSED, bearer_matches, token_from_env
from luftpause.config import Config, TlsPeer

METADATA_KEY = "authorization"


READ_BEFORE_REFUSING_S = 5.0
"""How long a refused stream's first message is waited for before the refusal (seconds)."""


def _refusing(handler: grpc.RpcMethodHandler[Any, Any]) -> grpc.RpcMethodHandler[Any, Any]:
    """A handler of the same kind as ``handler`` that ends the call with ``UNAUTHENTICATED``.

    A streaming call's first message is read first (for at most :data:`READ_BEFORE_REFUSING_S`):
    refused while its client was still writing it, a call ended ``INTERNAL`` ("Internal error from
    Core") at the client about one time in ten, so a dataplane with the wrong token sometimes
    answered its turns with that instead of the refusal."""

    async def refuse(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        if handler.request_streaming:
            try:
                async with asyncio.timeout(READ_BEFORE_REFUSING_S):
                    async for _ in request:
                        break
            except (TimeoutError, grpc.RpcError):
                pass
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, REFUSED)

    codecs = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(refuse, **codecs)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(refuse, **codecs)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(refuse, **codecs)
    return grpc.unary_unary_rpc_method_handler(refuse, **codecs)


class TokenInterceptor(grpc.aio.ServerInterceptor):
    """Refuse (``UNAUTHENTICATED``) every call whose ``authorization`` metadata is not
    ``Bearer <token>``."""

    def __init__(self, token: str) -> None:
        self.token = token.encode()

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler  # an unknown method: gRPC answers UNIMPLEMENTED itself
        given = next(
            (value for key, value in handler_call_details.invocation_metadata or () if key == METADATA_KEY),
            None,
        )
        if isinstance(given, str | bytes) and bearer_matches(given, self.token):
            return handler
        return _refusing(handler)


def server_interceptors(token: str | None) -> list[grpc.aio.ServerInterceptor]:
    """The scheduler's interceptors: the token check when ``token`` is set, else none."""
    return [TokenInterceptor(token)] if token else []


@dataclass(frozen=True)
class LinkCredentials:
    """How a dataplane reaches the scheduler: ``token`` (sent as metadata on every call) and
    ``tls`` (``None``: a plain channel)."""

    token: str | None = None
    tls: TlsPeer | None = None

    @classmethod
    def from_config(cls, config: Config) -> LinkCredentials:
        """``LUFTPAUSE_TOKEN`` and ``[dataplane.scheduler_tls]``."""
        return cls(token_from_env(), config.dataplane.scheduler_tls)

    @property
    def metadata(self) -> Sequence[tuple[str, str]] | None:
        """The call metadata (``None`` without a token)."""
        return ((METADATA_KEY, f"Bearer {self.token}"),) if self.token else None

    def channel(self, target: str, options: Sequence[tuple[str, Any]]) -> grpc.aio.Channel:
        """An ``aio`` channel to ``target`` (``host:port``) with ``options``."""
        if self.tls is None:
            return grpc.aio.insecure_channel(target, options=options)
        credentials = grpc_channel_credentials(self.tls, "dataplane.scheduler_tls")
        return grpc.aio.secure_channel(target, credentials, options=options)
