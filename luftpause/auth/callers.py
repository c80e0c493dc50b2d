"""Caller keys: API keys mapped to a caller, so that fairness cannot be spoofed.

Two modes at the dataplane's ``/v1`` routes:

* **shared token** (the simple mode): ``LUFTPAUSE_TOKEN`` set, every client carries it, and a
  turn's caller is whatever its ``x-luftpause-caller`` says (absent: the shared anonymous caller);
  unset, every request is accepted the same way.
* **caller keys**: keys configured (a file named by ``[dataplane] caller_keys``, and/or
  ``LUFTPAUSE_CALLER_KEYS``). Each client carries its own key as ``Authorization: Bearer <key>``;
  the shared token is no longer taken there (it stays the token of the scheduler's routes and
  link and of the runtime). A turn's caller is its key's:

  - ``x-luftpause-caller`` can only *narrow* it. Narrowed, not refused: a header ``job-7`` under
    the key of ``team-a`` makes the caller ``team-a/job-7``; a header that already is the key's
    caller, or starts with it and ``/``, is taken as it is; anything else is put below the key's
    caller the same way (``team-b`` under ``team-a`` is ``team-a/team-b``). So a client need not
    know the name its key maps to (the runtime sends its MCP callers and gets
    ``runtime/<MCP caller>``), no header can name a caller outside its key, and nothing a client
    could not hurt anyone with is refused. The whole caller is then cut to 128 bytes, which never
    reaches into the key's part (at most 64 bytes).
  - a narrowed caller is a sub-caller of the key's caller (``/`` separates them), and the
    scheduler shares the pool between root callers first, by the in-flight turns of each root and
    everything under it, then between the sub-callers of each root
    (``luftpause/scheduler/core/policies/ordering.py``); its protection limits hold for a caller and
    everything under it, counted for the most specific configured name, else the root
    (``luftpause/scheduler/core/policies/limits.py``). So a key that splits its turns over many
    narrowed callers gets the share of one caller against other keys, and escapes none of the
    limits of its caller (a key's caller with a ``/`` of its own is below that root too: keys of
    ``lab/a`` and ``lab/b`` share ``lab``'s part). The cut to 128 bytes never changes a root. The
    same rule holds without keys, for whatever the header says.
  - a key with ``narrow = false`` ignores the header: its caller is always the key's (its holder
    cannot split even its own share among its jobs).
  - a key names the service classes it may use (default both); ``x-luftpause-class`` naming
    another is refused 403 with the JSON error body; absent, the key's first class is used.
  - a request with no key, or one that is not configured, is refused 401.

The file (TOML)::

    [[keys]]
    caller = "team-a"                  # 1 to 64 printable ASCII characters, no space
    key_sha256 = "9f86d081884c7d65..." # the SHA-256 of the key, hex: printf %s "$KEY" | sha256sum
    classes = ["batch"]                # optional: the service classes it may use (default both)
    narrow = false                     # optional (default true)
    admin = false                      # optional: at the runtime, sees every tenant's runs

    [[keys]]
    caller = "runtime"
    key_env = "LUFTPAUSE_RUNTIME_KEY"  # the key in an environment variable ([runtime] dataplane_key_env)

    [[keys]]
    caller = "team-b"
    key = "a key of at least 16 characters"

Each entry gives its key exactly one way: ``key``, ``key_env`` or ``key_sha256``; a key (from
``key`` or ``key_env``) has at least 16 characters. ``LUFTPAUSE_CALLER_KEYS`` holds the same
entries as a JSON array (``[{"caller": "team-a", "key_env": "TEAM_A_KEY"}]``). A bad file or
variable is refused at start (:class:`~luftpause.config.ConfigError`, naming the file, the entry
and the key); so is one key given twice. Keys are kept only as their SHA-256: a presented key is
hashed and looked up, so the lookup's timing can tell nothing about a key.
"""

from __future__ import annotations

import hashlib
import os
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from luftpause.auth.tokens import bearer, bearer_matches, token_from_env
from luftpause.config import Config, ConfigError
from luftpause.config.faults import arrays_as_tuples, describe_fields

CALLER_KEYS_ENV = "LUFTPAUSE_CALLER_KEYS"
ServiceClassName = Literal["interactive", "batch"]
SERVICE_CLASSES: tuple[ServiceClassName, ...] = ("interactive", "batch")
KEY_CALLER_MAX_BYTES = 64
"""A key's caller is at most this long, so that narrowing below it always leaves room inside the
dataplane's 128-byte caller."""
MIN_KEY_CHARS = 16


class CallerRefused(Exception):
    """A request the caller keys refuse; ``status`` is 401 (no or an unknown key) or 403 (a
    service class the key may not use)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class CallerKey(BaseModel):
    """One entry of the keys file (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    caller: str
    key: str | None = None
    key_env: str | None = None
    key_sha256: str | None = None
    classes: tuple[ServiceClassName, ...] = Field(default=SERVICE_CLASSES, min_length=1)
    narrow: bool = True
    admin: bool = False
    """At the runtime only: the key sees every tenant's runs (docs/security-tenants.md)."""

    @field_validator("caller")
    @classmethod
    def _caller(cls, value: str) -> str:
        if not value or len(value) > KEY_CALLER_MAX_BYTES or not all("!" <= c <= "~" for c in value):
            raise ValueError(
                f"expected 1 to {KEY_CALLER_MAX_BYTES} printable ASCII characters without spaces, "
                f"got {value!r}"
            )
        return value

    @field_validator("key_sha256")
    @classmethod
    def _digest(cls, value: str | None) -> str | None:
        if value is not None:
            value = value.strip().lower()
            if len(value) != 64 or any(c not in "0123456789abcdef" for c in value):
                raise ValueError("expected 64 hexadecimal digits (a SHA-256)")
        return value

    @model_validator(mode="after")
    def _one_key(self) -> CallerKey:
        given = [name for name in ("key", "key_env", "key_sha256") if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError("expected exactly one of 'key', 'key_env' or 'key_sha256'")
        return self

    def digest(self) -> bytes:
        """The SHA-256 of the key. Raises ``ValueError`` when ``key_env`` names an unset variable or
        the key is shorter than :data:`MIN_KEY_CHARS`."""
        if self.key_sha256 is not None:
            return bytes.fromhex(self.key_sha256)
        key = self.key
        if self.key_env is not None:
            key = os.environ.get(self.key_env)
            if not key:
                raise ValueError(f"key_env: the environment variable {self.key_env} is not set")
        assert key is not None
        if len(key) < MIN_KEY_CHARS:
            raise ValueError(f"expected a key of at least {MIN_KEY_CHARS} characters")
        return hashlib.sha256(key.encode()).digest()


class _KeysFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    keys: tuple[CallerKey, ...] = Field(min_length=1)


@dataclass(frozen=True, slots=True)
class Identity:
    """Who a key says a client is: its ``caller``, the service ``classes`` it may use (the first is
    its default) and whether the caller header may ``narrow`` the caller."""

    caller: str
    classes: tuple[str, ...]
    narrow: bool = True
    admin: bool = False

    @property
    def tenant(self) -> str:
        """The root caller of the key (``lab`` for ``lab/a``): whose runs its holder sees at the
        runtime (docs/security-tenants.md)."""
        return self.caller.split("/", 1)[0]

    def caller_for(self, header: str | None) -> str:
        """The turn's caller for an ``x-luftpause-caller`` value (``None``: none sent), narrowed as
        the module docstring says; not yet cut to the dataplane's 128 bytes."""
        if not header or not self.narrow or header == self.caller:
            return self.caller
        if header.startswith(self.caller + "/"):
            return header
        return f"{self.caller}/{header}"

    def service_class(self, requested: str | None) -> str:
        """The turn's service class for an ``x-luftpause-class`` value (``None``: absent, the first
        of :attr:`classes`); :class:`CallerRefused` 403 for a class the key may not use."""
        if requested is None:
            return self.classes[0]
        if requested not in self.classes:
            raise CallerRefused(
                403,
                f"the key of caller {self.caller!r} may not send {requested!r} turns "
                f"(x-luftpause-class may be: {', '.join(self.classes)})",
            )
        return requested


class CallerKeys:
    """The configured keys, by SHA-256 digest. :meth:`identify` takes an ``Authorization`` value."""

    def __init__(self, entries: Iterable[tuple[bytes, Identity]]) -> None:
        self._by_digest: dict[bytes, Identity] = {}
        for digest, identity in entries:
            if digest in self._by_digest:
                raise ValueError(
                    f"one key is given twice (callers {self._by_digest[digest].caller!r} "
                    f"and {identity.caller!r})"
                )
            self._by_digest[digest] = identity

    def __len__(self) -> int:
        return len(self._by_digest)

    @property
    def callers(self) -> list[str]:
        """The callers the keys name, each once, in the order of the keys."""
        return list(dict.fromkeys(identity.caller for identity in self._by_digest.values()))

    def identify(self, authorization: str | bytes | None) -> Identity | None:
        """The identity of the bearer key in ``authorization``; ``None`` for none or an unknown one."""
        given = bearer(authorization)
        if given is None:
            return None
        # Looked up by the SHA-256 of what was presented: the lookup's timing can only tell how
        # that digest compares with the stored ones, and a digest gives no way back to a key, so
        # this is as good as comparing each key in constant time, at one hash per request.
        return self._by_digest.get(hashlib.sha256(given).digest())


def _entries(items: Iterable[CallerKey], where: str) -> list[tuple[bytes, Identity]]:
    out = []
    for index, item in enumerate(items):
        try:
            digest = item.digest()
        except ValueError as exc:
            raise ConfigError(f"{where}: keys[{index}]: {exc}") from None
        out.append((digest, Identity(item.caller, tuple(item.classes), item.narrow, item.admin)))
    return out


def parse_keys_file(text: str, source: str) -> list[tuple[bytes, Identity]]:
    """The entries of a keys file's TOML text; :class:`ConfigError` naming ``source`` otherwise."""
    try:
        data: dict[str, Any] = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: not valid TOML: {exc}") from None
    try:
        parsed = _KeysFile.model_validate(arrays_as_tuples(data))
    except ValidationError as exc:
        raise ConfigError(f"{source}: {describe_fields(exc)}") from None
    return _entries(parsed.keys, source)


def parse_keys_env(text: str) -> list[tuple[bytes, Identity]]:
    """The entries of ``LUFTPAUSE_CALLER_KEYS`` (a JSON array of the file's entries)."""
    where = f"${CALLER_KEYS_ENV}"
    try:
        data = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise ConfigError(f"{where}: not valid JSON: {exc}") from None
    if not isinstance(data, list):
        raise ConfigError(f"{where}: expected a JSON array of keys, got {type(data).__name__}")
    try:
        parsed = _KeysFile.model_validate({"keys": arrays_as_tuples(data)})
    except ValidationError as exc:
        raise ConfigError(f"{where}: {describe_fields(exc)}") from None
    return _entries(parsed.keys, where)


def load_caller_keys(config: Config) -> CallerKeys | None:
    """The keys of ``[dataplane] caller_keys`` and ``LUFTPAUSE_CALLER_KEYS`` together; ``None``
    when neither names any (the shared-token mode). Raises :class:`ConfigError`."""
    entries: list[tuple[bytes, Identity]] = []
    path = config.dataplane.caller_keys
    if path:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(
                f"{config.source}: dataplane.caller_keys: cannot read {path!r}: {exc.strerror}"
            ) from None
        entries += parse_keys_file(text, path)
    env = os.environ.get(CALLER_KEYS_ENV, "").strip()
    if env:
        entries += parse_keys_env(env)
    if not entries:
        return None
    try:
        return CallerKeys(entries)
    except ValueError as exc:
        raise ConfigError(f"{path or '$' + CALLER_KEYS_ENV}: {exc}") from None


class Access:
    """What the dataplane's ``/v1`` routes take: caller keys when ``keys`` is given, else the shared
    ``token`` (``None``: everything)."""

    def __init__(self, token: str | None, keys: CallerKeys | None) -> None:
        self.token = token.encode() if token else None
        self.keys = keys

    @classmethod
    def from_config(cls, config: Config) -> Access:
        """The keys of ``config`` and the environment, and ``LUFTPAUSE_TOKEN``; :class:`ConfigError`."""
        return cls(token_from_env(), load_caller_keys(config))

    @property
    def mode(self) -> str:
        """``"caller keys"``, ``"shared token"`` or ``"open"``, for the start-up log line."""
        if self.keys is not None:
            return "caller keys"
        return "shared token" if self.token is not None else "open"

    def refusal(self) -> str:
        """The message of a 401."""
        if self.keys is not None:
            return "missing or unknown caller key (Authorization: Bearer <your key>, or x-api-key)"
        return "missing or wrong bearer token (Authorization: Bearer <LUFTPAUSE_TOKEN>, or x-api-key)"

    def allows(self, authorization: str | bytes | None) -> bool:
        """Whether a request with this ``Authorization`` value may use the ``/v1`` routes."""
        if self.keys is not None:
            return self.keys.identify(authorization) is not None
        return self.token is None or bearer_matches(authorization, self.token)

    def resolve(
        self, authorization: str | bytes | None, service_class: str | None, caller: str | None
    ) -> tuple[str, str]:
        """``(service class, caller)`` of a turn from its ``Authorization``, ``x-luftpause-class``
        (``None``: absent; already checked to be a class name) and ``x-luftpause-caller``
        (``None``: absent). Raises :class:`CallerRefused` (401 without a known key, 403 for a
        class the key may not use)."""
        if self.keys is None:
            return service_class or SERVICE_CLASSES[0], caller or ""
        identity = self.keys.identify(authorization)
        if identity is None:
            raise CallerRefused(401, self.refusal())
        return identity.service_class(service_class), identity.caller_for(caller)
