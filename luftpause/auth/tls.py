"""Opt-in TLS and mutual TLS from the configuration's PEM files (``[scheduler.tls]``,
``[dataplane.tls]``, ``[runtime.tls]`` on listeners; ``[dataplane.scheduler_tls]``,
``[runtime.dataplane_tls]`` towards a server), in the three forms the processes need:

* granian's options (the dataplane's and the runtime's HTTP listeners): ``ssl_cert``, ``ssl_key``
  (PKCS#8), and with ``client_ca`` ``ssl_ca`` plus ``ssl_client_verify``; granian's minimum
  protocol stays its default, TLS 1.3;
* :class:`ssl.SSLContext` for aiohttp (the scheduler's HTTP listener, and the runtime's client
  of an ``https://`` dataplane);
* gRPC credentials (the scheduler's port and the dataplane's channel to it).

A file that cannot be read is refused at start with :class:`~luftpause.config.ConfigError`
naming the key (``dataplane.tls.cert: cannot read 'x.pem': No such file or directory``).
Certificates are checked against the name the client dialled (an IP address needs an IP
``subjectAltName``).
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

import grpc

from luftpause.config import ConfigError, TlsListener, TlsPeer


def read_pem(path: str, key: str) -> bytes:
    """The bytes of PEM file ``path``; :class:`ConfigError` naming configuration key ``key``."""
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"{key}: cannot read {path!r}: {exc.strerror}") from None


def check_listener(tls: TlsListener | None, where: str) -> None:
    """Read every file ``tls`` names (``where``: its key, e.g. ``dataplane.tls``), so that a missing
    one stops the process at start, before any worker; :class:`ConfigError`."""
    if tls is None:
        return
    read_pem(tls.cert, f"{where}.cert")
    read_pem(tls.key, f"{where}.key")
    if tls.client_ca is not None:
        read_pem(tls.client_ca, f"{where}.client_ca")


def check_peer(tls: TlsPeer | None, where: str) -> None:
    """As :func:`check_listener`, for a client's TLS options."""
    if tls is None:
        return
    for name in ("ca", "cert", "key"):
        path = getattr(tls, name)
        if path is not None:
            read_pem(path, f"{where}.{name}")


def granian_options(tls: TlsListener | None) -> dict[str, Any]:
    """Keyword arguments of ``granian.Granian`` for ``tls`` (``{}`` without)."""
    if tls is None:
        return {}
    options: dict[str, Any] = {"ssl_cert": Path(tls.cert), "ssl_key": Path(tls.key)}
    if tls.client_ca is not None:
        options.update(ssl_ca=Path(tls.client_ca), ssl_client_verify=True)
    return options


def server_context(tls: TlsListener, where: str) -> ssl.SSLContext:
    """A server-side context for ``tls`` (client certificates required with ``client_ca``)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(tls.cert, tls.key)
        if tls.client_ca is not None:
            context.load_verify_locations(cafile=tls.client_ca)
            context.verify_mode = ssl.CERT_REQUIRED
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"{where}: {exc}") from None
    return context


def client_context(tls: TlsPeer, where: str) -> ssl.SSLContext:
    """A client-side context for ``tls``: the server verified against ``ca`` (else the system's
    roots) and its name; ``cert``/``key`` presented when given."""
    try:
        context = ssl.create_default_context(cafile=tls.ca)
        if tls.cert is not None and tls.key is not None:
            context.load_cert_chain(tls.cert, tls.key)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"{where}: {exc}") from None
    return context


def grpc_server_credentials(tls: TlsListener, where: str) -> grpc.ServerCredentials:
    """gRPC server credentials for ``tls``; with ``client_ca`` a client certificate is required."""
    key = read_pem(tls.key, f"{where}.key")
    cert = read_pem(tls.cert, f"{where}.cert")
    client_ca = read_pem(tls.client_ca, f"{where}.client_ca") if tls.client_ca is not None else None
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=client_ca, require_client_auth=client_ca is not None
    )


def grpc_channel_credentials(tls: TlsPeer, where: str) -> grpc.ChannelCredentials:
    """gRPC channel credentials for ``tls`` (``ca`` unset: gRPC's default roots)."""
    return grpc.ssl_channel_credentials(
        root_certificates=read_pem(tls.ca, f"{where}.ca") if tls.ca is not None else None,
        private_key=read_pem(tls.key, f"{where}.key") if tls.key is not None else None,
        certificate_chain=read_pem(tls.cert, f"{where}.cert") if tls.cert is not None else None,
    )
