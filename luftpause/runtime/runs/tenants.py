"""Tenants: whose runs a request may see and act on (docs/security-tenants.md).

With caller keys configured (``[dataplane] caller_keys``, ``LUFTPAUSE_CALLER_KEYS``:
:mod:`luftpause.auth.callers`), every request to the runtime but its open paths carries a key, and
the runtime's HTTP edge (:class:`luftpause.runtime.web.auth.TenantGate`) puts the request's
:class:`Tenant` in its ASGI scope under :data:`SCOPE_KEY`: the root caller of the key, and whether
the key is an admin key. A run belongs to the tenant of the key that spawned it (``RunSpec.tenant``,
journaled in its ``start`` record); a sub-agent's own spawns inherit it. A request sees a run when
:func:`visible`: no tenant (no keys configured: one tenant, everyone), an admin key, or the run's own
tenant. A run that is not visible is answered exactly as a handle that does not exist.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from luftpause.runtime.runs.record import Run

SCOPE_KEY = "luftpause.tenant"
"""Where the runtime's HTTP edge puts a request's :class:`Tenant` in the ASGI scope."""


@dataclass(frozen=True, slots=True)
class Tenant:
    """Who a request is, as far as runs go: ``name`` (a key's root caller), ``admin`` (sees all),
    ``caller`` (the key's caller, under which the request's MCP caller is narrowed, as the
    dataplane narrows ``x-luftpause-caller``: two tenants' callers never share a name)."""

    name: str
    admin: bool = False
    caller: str | None = None

    def narrow(self, caller: str) -> str:
        """The MCP caller ``caller`` under this tenant's key: ``<key caller>/<caller>``."""
        own = self.caller or self.name
        if caller == own or caller.startswith(own + "/"):
            return caller
        return f"{own}/{caller}"


def visible(run: Run, tenant: Tenant | None) -> bool:
    """Whether a request of ``tenant`` (``None``: no keys configured) may see ``run``."""
    return tenant is None or tenant.admin or run.spec.tenant == tenant.name


def only_visible(runs: Iterable[Run], tenant: Tenant | None) -> list[Run]:
    """The runs of ``runs`` a request of ``tenant`` may see, in order."""
    return [run for run in runs if visible(run, tenant)]


def tenant_in(scope: Mapping[str, Any] | None) -> Tenant | None:
    """The :class:`Tenant` the HTTP edge put in an ASGI ``scope`` (``None``: none, no keys)."""
    found = scope.get(SCOPE_KEY) if scope is not None else None
    return found if isinstance(found, Tenant) else None


def spawned_tenant(tenant: Tenant | None) -> str | None:
    """The tenant a run spawned by a request of ``tenant`` belongs to (``None``: no keys)."""
    return tenant.name if tenant is not None else None
