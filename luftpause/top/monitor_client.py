"""Reading the runtime's monitor data for ``luftpause top``: where the runtime is, the poll, and
the checks of what it answers.

* Where: :func:`parse_url` turns what a person passes as ``--url`` into a base URL and the token
  in its query (the page's ``/monitor?token=...``), refusing a URL that cannot work with a
  :class:`TopError` that never shows the token (a runtime's configured ``[runtime] listen`` is
  reached with :func:`luftpause.config.listen_url`).
* The poll: :class:`NetworkPoller` reads ``GET {base}/monitor/runs?version=V``
  (:mod:`luftpause.runtime.web.monitor`) with the bearer token, never following a redirect (the
  token would go along), and keeps the last network so that an ``unchanged`` answer costs a
  comparison.
* The checks: :func:`check_runs` reads the ``runs`` list field by field, with the types this
  command reads them as; a runtime (or another server) that answers something else gives one
  line saying where (``runs[3].scope.heldByChildren``) and what was expected.

Every failure is a :class:`TopError` whose message is one line for a person. Text from the
server ends up on a terminal (in those messages, and in every cell ``top`` draws), so
:func:`printable` and :func:`one_line`, which make it safe to show, live here with the rest of what
handles the runtime's answers.
"""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from luftpause.runtime.web.auth import TOKEN_ENV

RUNS_PATH = "/monitor/runs"
REQUEST_TIMEOUT_SECONDS = 10.0
MESSAGE_CHARS = 200
"""Characters of a server's error text (an HTTP error's body) kept in an error line."""
ERROR_BODY_BYTES = 4096
"""Bytes of an HTTP error's body read for its message."""


class TopError(Exception):
    """The network could not be read: the message is one line, for a person."""


# --- what the runtime sends, made safe to print ----------------------------------------------------

# C0 controls, DEL and C1 controls (U+0080-U+009F: CSI, OSC... as single code points): a terminal
# acts on them. Whitespace among them becomes a space (lines are joined anyway).
_CONTROLS = {c: "\ufffd" for c in (*range(0x00, 0x20), 0x7F, *range(0x80, 0xA0))}
_CONTROLS.update({ord(c): " " for c in "\t\n\v\f\r"})


def printable(text: str) -> str:
    """``text`` with every C0 control, DEL and C1 control replaced (tab, newline and the other
    whitespace controls by a space, the rest by ``U+FFFD``), so a terminal shows it and never
    acts on it (an ESC starting a CSI or OSC sequence, a BEL ending one)."""
    return text.translate(_CONTROLS)


def one_line(text: str, limit: int | None = None) -> str:
    """``text`` :func:`printable`, its whitespace runs made one space, cut to ``limit``
    characters with ``…``."""
    line = " ".join(printable(text).split())
    return line if limit is None or len(line) <= limit else line[: limit - 1] + "…"


# --- the runtime ----------------------------------------------------------------------------------


def _shown_url(text: str) -> str:
    """``text`` as an error may show it: no query or fragment (a ``token``), no user info."""
    head = text.split("?", 1)[0].split("#", 1)[0]
    scheme, sep, rest = head.partition("://")
    if sep:
        authority, slash, path = rest.partition("/")
        head = f"{scheme}://{authority.rpartition('@')[2]}{slash}{path}"
    return one_line(head, MESSAGE_CHARS)


def parse_url(url: str) -> tuple[str, str | None]:
    """``(base URL, token)`` from what a person passes as ``--url``: ``http://`` is assumed
    without a scheme; a trailing ``/``, ``/mcp`` or ``/monitor`` is dropped (the MCP endpoint
    and the page are what people copy), so are the query and fragment, whose ``token`` (the
    page's ``/monitor?token=...``) is returned (``None`` without one).

    Raises :class:`TopError` (one line, no token in it) for an empty URL, a scheme other than
    ``http``/``https``, a missing or malformed host or port, or a user name or password in it."""
    text = url.strip()
    if not text:
        raise TopError("--url is empty: pass the runtime's URL, e.g. http://127.0.0.1:7000, or leave it out")
    if "://" not in text:
        text = "http://" + text
    shown = _shown_url(text)
    try:
        parts = urllib.parse.urlsplit(text)
        parts.port  # noqa: B018  # raises ValueError for a port that is not a number in 0-65535
    except ValueError as exc:
        raise TopError(f"{shown}: not a URL: {one_line(str(exc), MESSAGE_CHARS)}") from None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise TopError(f"{shown}: not an http:// or https:// URL (the runtime serves HTTP)")
    if parts.username is not None or parts.password is not None:
        raise TopError(
            f"{shown}: a user name or password in the URL is not used: pass the token with --token"
        )
    host = parts.hostname or ""
    if not host or any(c.isspace() or not c.isprintable() for c in host):
        raise TopError(f"{shown}: no valid host in the URL")
    path = parts.path.rstrip("/")
    for suffix in ("/mcp", "/monitor"):
        path = path.removesuffix(suffix)
    tokens = urllib.parse.parse_qs(parts.query).get("token")
    base = urllib.parse.urlunsplit((scheme, parts.netloc, path.rstrip("/"), "", ""))
    return base, (tokens[-1] if tokens else None)


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A redirect is answered as the HTTP error it is: following one would send the bearer
    token to wherever it points."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_OPENER = urllib.request.build_opener(_NoRedirects)


def _describe(exc: BaseException) -> str:
    # A bad status line's text is the bytes the port sent (a gRPC frame: binary): not shown.
    text = "" if isinstance(exc, http.client.BadStatusLine) else str(exc)
    return one_line(f"{type(exc).__name__}: {text}" if text else type(exc).__name__, MESSAGE_CHARS)


class MonitorDataError(ValueError):
    """The monitor's answer does not have the shape :meth:`NetworkPoller.poll` reads; the
    message names where (``runs[3].scope.heldByChildren``) and what was expected."""


_RUN_FIELDS: dict[str, tuple[type, ...]] = {
    "handle": (str,),
    "parent": (str, type(None)),
    "name": (str, type(None)),
    "state": (str, type(None)),
    "runState": (str, type(None)),
    "serviceClass": (str, type(None)),
    "turns": (int, type(None)),
    "toolCalls": (int, type(None)),
    "lastAnswer": (str, type(None)),
    "error": (str, type(None)),
    "scope": (dict, type(None)),
}


def _expect(value: Any, kinds: tuple[type, ...], where: str) -> None:
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        names = " or ".join("null" if k is type(None) else _JSON_NAMES.get(k, k.__name__) for k in kinds)
        got = "null" if value is None else _JSON_NAMES.get(type(value), type(value).__name__)
        raise MonitorDataError(f"{where}: expected {names}, got {got}")


_JSON_NAMES = {dict: "an object", list: "a list", str: "a string", int: "an integer", bool: "a boolean"}


def check_runs(runs: Any) -> list[dict[str, Any]]:
    """``runs`` (the monitor's ``runs`` list, parsed JSON) when every run has the fields this
    command reads with the types it reads them as (:data:`_RUN_FIELDS`; the scope as
    ``{"granted": [{"effect", "access": [str], "path"}], "heldByChildren": [...]}``); others are
    not looked at. Raises :class:`MonitorDataError`."""
    _expect(runs, (list,), "runs")
    for i, run in enumerate(runs):
        where = f"runs[{i}]"
        _expect(run, (dict,), where)
        for key, kinds in _RUN_FIELDS.items():
            _expect(run.get(key), kinds, f"{where}.{key}")
        scope = run.get("scope")
        if scope is not None:
            _expect(scope.get("granted", []), (list,), f"{where}.scope.granted")
            _expect(scope.get("heldByChildren", []), (list,), f"{where}.scope.heldByChildren")
            for j, rule in enumerate(scope.get("granted", [])):
                at = f"{where}.scope.granted[{j}]"
                _expect(rule, (dict,), at)
                _expect(rule.get("effect"), (str, type(None)), f"{at}.effect")
                _expect(rule.get("path"), (str, type(None)), f"{at}.path")
                _expect(rule.get("access", []), (list,), f"{at}.access")
                for k, mode in enumerate(rule.get("access", [])):
                    _expect(mode, (str,), f"{at}.access[{k}]")
    checked: list[dict[str, Any]] = runs
    return checked


@dataclass
class NetworkPoller:
    """Reads ``GET {base}/monitor/runs`` with the bearer ``token``, sending the version it has so
    that an unchanged network costs one comparison (the runtime answers ``unchanged``)."""

    base: str
    token: str | None
    timeout: float = REQUEST_TIMEOUT_SECONDS
    version: str | None = None
    runs: list[dict[str, Any]] | None = field(default=None)

    def poll(self) -> list[dict[str, Any]]:
        """The network's runs (the monitor's ``runs`` list, oldest first). Raises
        :class:`TopError` with a one-line reason when the runtime cannot be read or its answer
        is not the monitor's data."""
        query = f"?{urllib.parse.urlencode({'version': self.version})}" if self.version else ""
        try:
            request = urllib.request.Request(
                self.base + RUNS_PATH + query, headers={"Accept": "application/json"}
            )
            if self.token:
                request.add_unredirected_header("Authorization", f"Bearer {self.token}")
            with _OPENER.open(request, timeout=self.timeout) as response:
                raw = response.read()
        except urllib.error.HTTPError as err:
            raise TopError(self._refusal(err.code, _error_body(err))) from None
        except urllib.error.URLError as err:
            reason = err.reason if isinstance(err.reason, BaseException) else str(err.reason)
            shown = (
                _describe(reason) if isinstance(reason, BaseException) else one_line(reason, MESSAGE_CHARS)
            )
            raise TopError(f"{self.base}: cannot reach the runtime: {shown}") from None
        except http.client.HTTPException as err:  # BadStatusLine, IncompleteRead, InvalidURL...
            raise TopError(
                f"{self.base}: no HTTP answer the monitor gives (is this the runtime?): {_describe(err)}"
            ) from None
        except (OSError, ValueError) as err:  # a timeout while reading; a host IDNA cannot encode
            raise TopError(f"{self.base}: cannot reach the runtime: {_describe(err)}") from None
        try:
            body = json.loads(raw)
        except ValueError as err:
            raise TopError(f"{self.base}{RUNS_PATH}: not JSON: {_describe(err)}") from None
        if not isinstance(body, dict) or not isinstance(body.get("version"), str | int):
            raise TopError(f"{self.base}{RUNS_PATH}: not a luftpause runtime's monitor data: no version")
        if body.get("unchanged") and self.runs is not None and str(body["version"]) == self.version:
            return self.runs
        try:
            runs = check_runs(body.get("runs"))
        except MonitorDataError as err:
            what = one_line(str(err), MESSAGE_CHARS)
            raise TopError(
                f"{self.base}{RUNS_PATH}: not a luftpause runtime's monitor data: {what}"
            ) from None
        self.version, self.runs = str(body["version"]), runs
        return self.runs

    def _refusal(self, status: int, raw: bytes) -> str:
        try:
            message = str(json.loads(raw)["error"]["message"])
        except (ValueError, KeyError, TypeError, IndexError):
            message = raw.decode("utf-8", "replace")
        if status == 401:
            if self.token:
                return f"{self.base}: 401: the runtime refused the token (a wrong --token or ${TOKEN_ENV})"
            return f"{self.base}: 401: the runtime needs a token: pass --token or set ${TOKEN_ENV}"
        if status == 404:
            return f"{self.base}: 404: no monitor here (is this the runtime's address?)"
        return f"{self.base}: HTTP {status}: {one_line(message, MESSAGE_CHARS)}"


def _error_body(err: urllib.error.HTTPError) -> bytes:
    try:
        return err.read(ERROR_BODY_BYTES)
    except (OSError, http.client.HTTPException, ValueError):
        return b""
