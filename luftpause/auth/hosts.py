"""The ``Host`` allow-list of the scheduler's HTTP routes: DNS rebinding.

A web page on ``evil.example`` can make its own name resolve to ``127.0.0.1`` after it loaded
(DNS rebinding); the browser then sends the page's requests to a listener on this machine as
same-origin ones, and lets the page read the answers, but with ``Host: evil.example``. So a
listener that answers only for names it knows cannot be read that way. Allowed (any port):

* an IP address literal (``127.0.0.1``, ``[::1]``, ``10.0.0.5``): a page can only be *at* that
  origin if the address served it, so no rebinding page has one;
* ``localhost``, this machine's host name (:func:`socket.gethostname`) and the listen address's
  host when it is a name;
* the names configured (``[scheduler] allowed_hosts``); ``"*"`` there turns the check off.

A request without ``Host`` (HTTP/1.0) is refused too: every browser sends one.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable

ANY = "*"


def host_name(host: str) -> str:
    """The name part of a ``Host`` value: ``"a.example:5001"`` -> ``"a.example"``, ``"[::1]:5001"``
    -> ``"::1"``; lower case, without a trailing dot."""
    host = host.strip()
    if host.startswith("["):
        name = host[1 : host.find("]")] if "]" in host else host[1:]
    elif host.count(":") == 1:
        name = host.split(":", 1)[0]
    else:
        name = host  # a bare IPv6 address (not valid in Host, but unambiguous) or a bare name
    return name.lower().rstrip(".")


def is_ip_literal(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


class HostAllowList:
    """The names a listener on ``listen_host`` answers for, plus ``extra`` (see the module
    docstring). :meth:`allows` takes a request's ``Host`` header value."""

    def __init__(self, listen_host: str, extra: Iterable[str] = ()) -> None:
        extra = [name.strip() for name in extra]
        self.any = ANY in extra
        names = {"localhost", socket.gethostname().lower()}
        listen = host_name(listen_host) if listen_host else ""
        if listen and not is_ip_literal(listen):
            names.add(listen)
        names.update(host_name(name) for name in extra if name and name != ANY)
        self.names = frozenset(names)

    def allows(self, host: str | None) -> bool:
        """Whether a request with ``Host: host`` (``None``: none sent) may be answered."""
        if self.any:
            return True
        if not host:
            return False
        name = host_name(host)
        return name in self.names or is_ip_literal(name)

    def refusal(self, host: str | None) -> str:
        """The message of a 421 for ``host``."""
        return (
            f"Host {host!r} is not served here (DNS rebinding protection): use an IP address, "
            "localhost, or a name in [scheduler] allowed_hosts"
        )
