"""The shared token (``LUFTPAUSE_TOKEN``) and the bearer check every process makes with it.

With the token set, a request must carry ``Authorization: Bearer <token>`` (RFC 6750 section 2.1;
the scheme compared case-insensitively, RFC 9110 section 11.1) and the token is compared in
constant time (:func:`hmac.compare_digest`), so the time an answer takes says nothing about how
much of a guess was right. Unset (or empty), every request is accepted and each process warns at
start.
"""

from __future__ import annotations

import hmac
import os

TOKEN_ENV = "LUFTPAUSE_TOKEN"

CHALLENGE = 'Bearer realm="luftpause"'
"""The ``WWW-Authenticate`` value of every 401 (RFC 6750 section 3)."""

REFUSED = f"missing or wrong bearer token (Authorization: Bearer <{TOKEN_ENV}>)"
"""The message of a refused token."""


def token_from_env() -> str | None:
    """The shared token from ``LUFTPAUSE_TOKEN``; ``None`` when unset or empty."""
    return os.environ.get(TOKEN_ENV) or None


def bearer(authorization: str | bytes | None) -> bytes | None:
    """The credential of an ``Authorization: Bearer <credential>`` value, as bytes; ``None`` when
    the header is absent, empty or of another scheme."""
    if authorization is None:
        return None
    raw = authorization.encode("latin-1") if isinstance(authorization, str) else authorization
    scheme, _, given = raw.strip().partition(b" ")
    if scheme.lower() != b"bearer":
        return None
    given = given.strip()
    return given or None


def bearer_matches(authorization: str | bytes | None, token: str | bytes) -> bool:
    """Whether ``authorization`` is ``Bearer <token>``, compared in constant time."""
    given = bearer(authorization)
    expected = token.encode() if isinstance(token, str) else token
    return given is not None and hmac.compare_digest(given, expected)
