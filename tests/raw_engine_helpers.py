"""A scripted HTTP/1.1 engine on blocking sockets in threads, for tests of the dataplane's engine
client that need an engine to close, reset or stop listening at an exact point of an exchange
(no HTTP server library lets a test aim there).

``RawEngine(script)`` listens on a free loopback port; every ``POST`` is read whole (by its
``Content-Length``) and handed to ``script(request)``, which answers on ``request.sock`` with the
helpers below (:func:`answer_json`, :func:`answer_stream`), or ends the connection (:func:`close`:
FIN; :func:`reset`: RST), or writes part of an answer first. A ``GET`` (a scheduler's probe) is
answered 404 and its connection closed, and is not recorded. Because the engine runs in threads,
a test may block its own event loop while the engine acts (:meth:`RawEngine.close_idle`), so the
loop cannot read what the engine did before the code under test looks.
"""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import orjson

from luftpause.testkit.launch.procs import free_port


@dataclass
class RawRequest:
    """One ``POST``: ``connection`` (0-based, in accept order), ``nth`` (0-based on its connection)."""

    connection: int
    nth: int
    head: bytes
    body: bytes
    sock: socket.socket

    @property
    def json(self) -> dict[str, object]:
        loaded: dict[str, object] = orjson.loads(self.body)
        return loaded


Script = Callable[[RawRequest], None]


@dataclass
class RawEngine:
    script: Script
    port: int = field(default_factory=free_port)
    posts: list[RawRequest] = field(default_factory=list)
    connections: int = 0
    _listener: socket.socket | None = None
    _open: set[socket.socket] = field(default_factory=set)
    _idle: set[socket.socket] = field(default_factory=set)
    _lock: threading.Condition = field(default_factory=threading.Condition)
    _threads: list[threading.Thread] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> RawEngine:
        listener = socket.create_server(("127.0.0.1", self.port))
        self._listener = listener
        self._spawn(self._accept, listener)
        return self

    def __enter__(self) -> RawEngine:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    def stop_listening(self) -> None:
        """Close the listening socket: a new connection is refused from now on; the open ones stay."""
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread; close alone would not
            listener.close()

    def close_idle(self) -> int:
        """End every connection waiting for its next request (FIN, then closed); how many."""
        idle = self._wait_idle()
        for sock in idle:
            sock.shutdown(socket.SHUT_RDWR)
        return len(idle)

    def send_to_idle(self, data: bytes) -> int:
        """Write ``data`` on every connection waiting for its next request; how many."""
        idle = self._wait_idle()
        for sock in idle:
            sock.sendall(data)
        return len(idle)

    def _wait_idle(self) -> list[socket.socket]:
        """The open connections, once every one is waiting for its next request (a client may have
        its answer before the serving thread is back at reading); at most 10 s."""
        with self._lock:
            self._lock.wait_for(lambda: self._idle == self._open, 10)
            return list(self._idle)

    def stop(self) -> None:
        self.stop_listening()
        with self._lock:
            socks = list(self._open)
        for sock in socks:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for thread in self._threads:
            thread.join(10)

    def _spawn(self, target: Callable[..., None], *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                sock, _ = listener.accept()
            except OSError:
                return  # closed: stop_listening
            with self._lock:
                index = self.connections
                self.connections += 1
                self._open.add(sock)
            self._spawn(self._serve, sock, index)

    def _serve(self, sock: socket.socket, index: int) -> None:
        buffer = b""
        nth = 0
        try:
            while True:
                with self._lock:
                    self._idle.add(sock)
                    self._lock.notify_all()
                while b"\r\n\r\n" not in buffer:
                    data = sock.recv(65536)
                    if not data:
                        return
                    buffer += data
                with self._lock:
                    self._idle.discard(sock)
                head, _, buffer = buffer.partition(b"\r\n\r\n")
                if head.startswith(b"GET "):
                    sock.sendall(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                    return
                length = _content_length(head)
                while len(buffer) < length:
                    data = sock.recv(65536)
                    if not data:
                        return
                    buffer += data
                request = RawRequest(index, nth, head, buffer[:length], sock)
                buffer = buffer[length:]
                nth += 1
                with self._lock:
                    self.posts.append(request)
                self.script(request)
        except OSError:
            return
        finally:
            with self._lock:
                self._open.discard(sock)
                self._idle.discard(sock)
            sock.close()


def _content_length(head: bytes) -> int:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0


def completion(content: str = "hello", model: str = "m") -> dict[str, object]:
    """A chat completion as OpenAI's API answers one (not streamed)."""
    return {
        "id": "chatcmpl-raw",
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


def chunk(content: str, model: str = "m", finish: str | None = None) -> bytes:
    """One streamed chat completion chunk as a server-sent event."""
    event = {
        "id": "chatcmpl-raw",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": model,
        "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": finish}],
    }
    return b"data: " + orjson.dumps(event) + b"\n\n"


def answer_json(sock: socket.socket, payload: object) -> None:
    """A 200 with a JSON body, the connection kept alive."""
    body = orjson.dumps(payload)
    sock.sendall(
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
        % (len(body), body)
    )


STREAM_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


def chunked(data: bytes) -> bytes:
    """``data`` as one piece of a chunked body (RFC 9112 section 7.1)."""
    return b"%x\r\n%s\r\n" % (len(data), data)


def answer_stream(sock: socket.socket, events: list[bytes]) -> None:
    """A 200 streaming ``events`` then ``data: [DONE]``, chunked, the connection kept alive."""
    sock.sendall(STREAM_HEAD + b"".join(chunked(e) for e in [*events, b"data: [DONE]\n\n"]) + b"0\r\n\r\n")


def close(sock: socket.socket) -> None:
    """End the connection cleanly (FIN) without answering."""
    sock.shutdown(socket.SHUT_RDWR)


def reset(sock: socket.socket) -> None:
    """End the connection with an RST (``SO_LINGER`` 0) without answering more."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()  # the serving thread's next read fails and ends it
