"""One ``Connect`` stream to a scheduler, as a stranger or a dataplane would open it, for the tests
of the link's token and TLS. The synchronous ``grpc`` API: ``grpc.aio`` calls made from several
``asyncio.run`` loops in one process (one per test) sometimes end ``INTERNAL`` ("Internal error
from Core") whatever the server answered."""

from __future__ import annotations

import grpc

from luftpause.v1 import scheduler_pb2 as pb
from luftpause.v1 import scheduler_pb2_grpc as pb_grpc


def connect_once(
    target: str,
    metadata: tuple[tuple[str, str], ...] | None,
    dataplane_id: str,
    credentials: grpc.ChannelCredentials | None = None,
) -> str:
    """Open a stream to ``target`` with ``metadata`` (and TLS ``credentials``), send a resync for
    ``dataplane_id`` and end the stream: the first item kind answered (``"resynced"``) or the name
    of the status the call ended with (``"UNAUTHENTICATED"``, ``"UNAVAILABLE"``)."""
    if credentials is None:
        channel = grpc.insecure_channel(target)
    else:
        channel = grpc.secure_channel(target, credentials)
    with channel:
        resync = pb.DataplaneMessage(
            items=[pb.DataplaneItem(resync=pb.ResyncRequest(dataplane_id=dataplane_id))]
        )
        try:
            replies = pb_grpc.SchedulerStub(channel).Connect(iter([resync]), metadata=metadata, timeout=30)
            first = next(replies)
        except grpc.RpcError as exc:
            return str(exc.code().name)  # type: ignore[attr-defined]
        replies.cancel()
        return first.items[0].WhichOneof("item") or "nothing"
