"""Engine replicas discovered from the Kubernetes API by label selector (``[scheduler.discovery]``,
:class:`~luftpause.config.DiscoveryConfig`), as SGLang Model Gateway discovers its workers.

Every ``interval_s`` the scheduler lists the pods of one namespace that match a label selector
(Kubernetes API ``GET /api/v1/namespaces/{namespace}/pods?labelSelector=...``, a ``PodList``,
with the service account's bearer token) and makes the replica set follow it: a running pod
whose ``Ready`` condition is true and which has a pod IP is a replica named after the pod, at
``http://<pod IP>:<port>``, serving the configured models or those of its ``luftpause.io/models``
annotation (comma separated); one that appears is added, one that is gone (or no longer ready)
is removed through :meth:`~luftpause.scheduler.host.SchedulerHost.remove_replica` (its placed
turns end where they are). Only replicas discovered here are ever removed here: the file's
``[[replicas]]`` and those added through the admin API are left alone, and a discovered name
that clashes with one of them is skipped.

A listing that fails (the API unreachable, 401/403, an answer that is not a ``PodList``) changes
nothing and is logged; the next one is tried after ``interval_s``. ``PodList`` and ``Pod`` fields
read: ``items[].metadata.name``, ``.metadata.annotations``, ``.status.phase``, ``.status.podIP``,
``.status.conditions[type=Ready].status`` (Kubernetes API reference, "Pod v1 core").
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
from pydantic import ValidationError

from luftpause.config import DiscoveryConfig, ReplicaConfig
from luftpause.config.faults import describe_fields

log = logging.getLogger("luftpause.scheduler")

MODELS_ANNOTATION = "luftpause.io/models"
"""A pod annotation naming the models its engine serves (comma separated), over the configured ones."""

REQUEST_TIMEOUT_S = 5.0
"""A listing's bound: connect and read."""

PodList = dict[str, Any]


class DiscoveryError(Exception):
    """A listing that could not be made or read; nothing is changed."""


def replicas_of(pods: PodList, discovery: DiscoveryConfig) -> list[ReplicaConfig]:
    """The replicas the pods of a ``PodList`` stand for (module docstring), in its order; a pod
    without models, or whose replica does not validate, is left out (logged).

    Raises :class:`DiscoveryError` when ``pods`` is not a ``PodList``."""
    if not isinstance(pods, dict) or pods.get("kind") != "PodList" or not isinstance(pods.get("items"), list):
        raise DiscoveryError("the API server's answer is not a PodList")
    found = []
    for pod in pods["items"]:
        metadata = pod.get("metadata") or {}
        status = pod.get("status") or {}
        name, ip = metadata.get("name"), status.get("podIP")
        ready = any(
            c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or ()
        )
        if not (
            isinstance(name, str)
            and isinstance(ip, str)
            and ip
            and status.get("phase") == "Running"
            and ready
        ):
            continue
        annotated = (metadata.get("annotations") or {}).get(MODELS_ANNOTATION)
        models = (
            tuple(m.strip() for m in annotated.split(",") if m.strip())
            if isinstance(annotated, str)
            else discovery.models
        )
        host = f"[{ip}]" if ":" in ip else ip
        try:
            found.append(
                ReplicaConfig(
                    name=name,
                    url=f"http://{host}:{discovery.port}",
                    models=models,
                    kind=discovery.kind,
                    api_key_env=discovery.api_key_env,
                    health_path=discovery.health_path,
                    max_inflight=discovery.max_inflight,
                    apis=discovery.apis,
                )
            )
        except ValidationError as exc:
            log.warning("discovery: pod %s skipped: %s", name, describe_fields(exc))
    return found


def pods_path(discovery: DiscoveryConfig) -> str:
    """The API path and query that lists the selected pods."""
    return (
        f"/api/v1/namespaces/{quote(discovery.namespace, safe='')}/pods"
        f"?labelSelector={quote(discovery.label_selector, safe='')}"
    )


async def list_pods(discovery: DiscoveryConfig, session: aiohttp.ClientSession) -> PodList:
    """One listing from the API server (the token file read now: service account tokens rotate).
    Raises :class:`DiscoveryError`."""
    try:
        # A small file on a local volume (the service account's): read on the loop, as the
        # probes' configuration is.
        token = Path(discovery.token_file).read_text(encoding="utf-8").strip()  # noqa: ASYNC240
    except OSError as exc:
        raise DiscoveryError(f"token file {discovery.token_file}: {exc.strerror}") from None
    context: ssl.SSLContext | bool = True
    if discovery.api_server.startswith("https://") and discovery.ca_file is not None:
        try:
            context = ssl.create_default_context(cafile=discovery.ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise DiscoveryError(f"CA file {discovery.ca_file}: {exc}") from None
    url = discovery.api_server + pods_path(discovery)
    try:
        async with session.get(
            url,
            headers={"authorization": f"Bearer {token}", "accept": "application/json"},
            ssl=context,
            timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S),
        ) as response:
            if response.status != 200:
                raise DiscoveryError(f"{url}: HTTP {response.status}: {(await response.text())[:200]}")
            answer: PodList = await response.json(content_type=None)
            return answer
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        raise DiscoveryError(f"{url}: {type(exc).__name__}: {exc}") from None


class Discovery:
    """Keeps the replicas discovered so far and applies each listing to the host's replica set.

    ``Discovery(host, discovery)``; :meth:`apply` takes a ``PodList``, :meth:`run` lists forever.
    ``host`` is what :class:`~luftpause.scheduler.host.SchedulerHost` offers: ``replicas``,
    ``add_replica``, ``remove_replica``.
    """

    def __init__(self, host: Any, discovery: DiscoveryConfig) -> None:
        self.host = host
        self.config = discovery
        self.discovered: set[str] = set()
        """Names of the replicas this discovery added and has not removed."""

    def apply(self, pods: PodList) -> list[str]:
        """Make the discovered part of the replica set follow ``pods``; what was done, one line each.
        Raises :class:`DiscoveryError` for an answer that is not a ``PodList`` (nothing changed)."""
        wanted = {replica.name: replica for replica in replicas_of(pods, self.config)}
        done = []
        for name in sorted(self.discovered - wanted.keys()):
            self.discovered.discard(name)
            if name in self.host.replicas:
                self.host.remove_replica(name)
                done.append(f"removed {name}")
        for name, replica in wanted.items():
            if name in self.discovered:
                continue
            if name in self.host.replicas:
                log.warning("discovery: pod %s skipped: a configured replica has its name", name)
                continue
            self.host.add_replica(replica)
            self.discovered.add(name)
            done.append(f"added {name} ({replica.url})")
        return done

    async def run(
        self, fetch: Callable[[], Awaitable[PodList]] | None = None, stop: asyncio.Event | None = None
    ) -> None:
        """List and apply every ``interval_s`` until ``stop`` is set (or the task is cancelled);
        ``fetch`` defaults to :func:`list_pods` with a session of its own."""
        stop = stop or asyncio.Event()
        async with aiohttp.ClientSession() as session:
            fetch = fetch or (lambda: list_pods(self.config, session))
            failing = False
            while not stop.is_set():
                try:
                    done = self.apply(await fetch())
                    if done:
                        log.warning("discovery: %s", "; ".join(done))
                    if failing:
                        log.warning("discovery: listing pods works again")
                    failing = False
                except DiscoveryError as exc:
                    if not failing:
                        log.error("discovery: pods not listed, replicas left as they are: %s", exc)
                    failing = True
                try:
                    await asyncio.wait_for(stop.wait(), self.config.interval_s)
                except TimeoutError:
                    pass
