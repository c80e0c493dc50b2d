"""Replicas discovered from the Kubernetes API by label selector (``[scheduler.discovery]``,
:mod:`luftpause.scheduler.discovery`), against an API exchange kept in ``tests/data/kubernetes/``
(no cluster here): two answers to the pods listing of a StatefulSet of SGLang engines, each pod
valid against the Kubernetes Pod schema, served over HTTP by a stand-in API server that checks
the request the scheduler makes (path, label selector, bearer token)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from repo_paths import ROOT

from luftpause.config import ConfigError, parse_config
from luftpause.scheduler.discovery import Discovery, DiscoveryError, pods_path, replicas_of
from luftpause.scheduler.host import SchedulerHost

EXCHANGE = json.loads((ROOT / "tests" / "data" / "kubernetes" / "pods_exchange.json").read_text())
FIRST, SECOND = EXCHANGE["responses"]
TOKEN = "service-account-token-0123"


def config_text(api_server: str = "https://kubernetes.default.svc", token_file: str = "/t") -> str:
    return f"""
[scheduler.discovery]
namespace = "inference"
label_selector = "app=sglang"
port = 30000
models = ["qwen2.5-0.5b-instruct"]
max_inflight = 8
api_server = "{api_server}"
token_file = "{token_file}"

[[replicas]]
name = "static-0"
url = "http://10.0.0.5:30000"
models = ["qwen2.5-0.5b-instruct"]
"""


def test_the_kept_exchange_is_made_of_valid_kubernetes_pods() -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    for answer in EXCHANGE["responses"]:
        assert (answer["kind"], answer["apiVersion"]) == ("PodList", "v1")
        for pod in answer["items"]:
            kubernetes_validate.validate({"apiVersion": "v1", "kind": "Pod", **pod}, "1.30", strict=True)


def test_only_running_ready_pods_with_an_ip_are_replicas_with_their_annotated_models() -> None:
    discovery = parse_config(config_text(), "k8s.toml").scheduler.discovery
    assert discovery is not None
    found = {replica.name: replica for replica in replicas_of(FIRST, discovery)}
    assert set(found) == {"sglang-0", "sglang-1"}  # sglang-2 pending (no IP), sglang-3 not ready
    assert found["sglang-0"].url == "http://10.244.3.21:30000"
    assert found["sglang-0"].models == ("qwen2.5-0.5b-instruct", "qwen2.5-0.5b")  # its annotation
    assert found["sglang-1"].models == ("qwen2.5-0.5b-instruct",)  # the configured ones
    assert found["sglang-1"].max_inflight == 8
    with pytest.raises(DiscoveryError):
        replicas_of({"kind": "Status", "status": "Failure", "code": 403}, discovery)


def test_the_discovered_replicas_follow_the_listings_and_the_files_are_left_alone() -> None:
    config = parse_config(config_text(), "k8s.toml")
    assert config.scheduler.discovery is not None
    host = SchedulerHost(config, clock=lambda: 100.0)
    discovery = Discovery(host, config.scheduler.discovery)
    assert discovery.apply(FIRST) == [
        "added sglang-0 (http://10.244.3.21:30000)",
        "added sglang-1 (http://10.244.3.22:30000)",
    ]
    assert set(host.replicas) == {"static-0", "sglang-0", "sglang-1"}
    assert discovery.apply(FIRST) == []  # nothing changed
    assert discovery.apply(SECOND) == ["removed sglang-1", "added sglang-3 (http://10.244.5.9:30000)"]
    assert set(host.replicas) == {"static-0", "sglang-0", "sglang-3"}
    with pytest.raises(DiscoveryError):
        discovery.apply({"kind": "PodList"})  # no items: refused, nothing changed
    assert set(host.replicas) == {"static-0", "sglang-0", "sglang-3"}
    clash = {**SECOND, "items": [{**SECOND["items"][0], "metadata": {"name": "static-0"}}]}
    assert discovery.apply(clash) == ["removed sglang-0", "removed sglang-3"]  # static-0 not taken
    assert set(host.replicas) == {"static-0"}


def test_sighup_reloads_the_files_replicas_and_keeps_the_discovered_ones(tmp_path: Path) -> None:
    from luftpause.scheduler.server import reload_replicas

    path = tmp_path / "k8s.toml"
    path.write_text(config_text())
    config = parse_config(path.read_text(), str(path))
    assert config.scheduler.discovery is not None
    host = SchedulerHost(config, clock=lambda: 100.0)
    discovery = Discovery(host, config.scheduler.discovery)
    discovery.apply(FIRST)
    path.write_text(config_text().replace('name = "static-0"', 'name = "static-1"'))
    reload_replicas(host, str(path), discovery)
    assert set(host.replicas) == {"static-1", "sglang-0", "sglang-1"}


def test_discovery_settings_are_checked_like_every_table() -> None:
    with pytest.raises(ConfigError, match=r"scheduler\.discovery\.port: expected a number <= 65535"):
        parse_config(config_text().replace("port = 30000", "port = 70000"), "k8s.toml")
    with pytest.raises(ConfigError, match=r"label_selectr: unknown key \(did you mean 'label_selector'\?\)"):
        parse_config(config_text().replace("label_selector", "label_selectr"), "k8s.toml")


class ApiServer:
    """A stand-in Kubernetes API server on loopback: answers the pods listing with the kept
    answers in turn (the last one again once they are used up) and keeps each request."""

    def __init__(self) -> None:
        self.requests: list[web.Request] = []
        self.listed = asyncio.Event()

    async def pods(self, request: web.Request) -> web.Response:
        self.requests.append(request)
        if request.headers.get("authorization") != f"Bearer {TOKEN}":
            return web.json_response({"kind": "Status", "code": 401, "reason": "Unauthorized"}, status=401)
        answers = EXCHANGE["responses"]
        body: dict[str, Any] = answers[min(len(self.requests) - 1, len(answers) - 1)]
        if len(self.requests) >= len(answers):
            self.listed.set()
        return web.json_response(body)


@pytest.mark.anyio
async def test_the_scheduler_lists_pods_over_http_with_its_token_and_applies_each_answer(
    tmp_path: Path,
) -> None:
    api = ApiServer()
    app = web.Application()
    app.router.add_get("/api/v1/namespaces/{namespace}/pods", api.pods)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    config = parse_config(config_text(f"http://127.0.0.1:{port}", str(token_file)), "k8s.toml")
    discovery_config = config.scheduler.discovery
    assert discovery_config is not None
    discovery_config = discovery_config.model_copy(update={"interval_s": 0.01})
    host = SchedulerHost(config, clock=lambda: 100.0)
    discovery = Discovery(host, discovery_config)
    stop = asyncio.Event()
    running = asyncio.create_task(discovery.run(stop=stop))
    try:
        await asyncio.wait_for(api.listed.wait(), 30)
    finally:
        stop.set()
        await running
        await runner.cleanup()
    first = api.requests[0]
    assert first.path == "/api/v1/namespaces/inference/pods"
    assert dict(first.query) == EXCHANGE["request"]["query"]
    assert first.path_qs == pods_path(discovery_config)
    assert set(host.replicas) == {"static-0", "sglang-0", "sglang-3"}  # the second answer applied
    assert discovery.discovered == {"sglang-0", "sglang-3"}
