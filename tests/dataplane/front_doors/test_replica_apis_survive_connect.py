"""The replicas' ``apis`` survive the replica set the scheduler sends each dataplane over Connect
(which replaces the dataplane's own file): without them every natively served turn would be
translated after the first Connect."""

from __future__ import annotations

from luftpause.config import ReplicaConfig, parse_config
from luftpause.dataplane.wiring import build_dataplane
from luftpause.scheduler.grpc_service import replica_set

CONFIG = """
[[replicas]]
name = "native"
url = "http://127.0.0.1:1"
models = ["m"]
apis = ["chat", "messages", "responses"]

[[replicas]]
name = "plain"
url = "http://127.0.0.1:2"
models = ["p"]
"""


def test_the_replica_set_carries_each_replicas_apis_and_the_dataplane_plans_by_them() -> None:
    config = parse_config(CONFIG)
    item = replica_set(config.replicas)
    assert [list(spec.apis) for spec in item.replicas.replicas] == [
        ["chat", "messages", "responses"],
        ["chat"],
    ]
    replicas = build_dataplane(
        parse_config(CONFIG.replace('apis = ["chat", "messages", "responses"]', ""))
    ).replicas
    payload = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
    assert (
        replicas.front_doors.plan("messages", payload, b"{}", "m").native is None
    )  # the file says chat only
    replicas.learn(item.replicas)  # what Connect delivers (the link is built with it)
    planned = replicas.front_doors.plan("messages", payload, b"{}", "m")
    assert planned.native is not None and planned.translation is None  # served natively, untranslated
    assert (
        replicas.front_doors.plan("messages", {**payload, "model": "p"}, b"{}", "p").translation is not None
    )


def test_a_replica_from_the_admin_api_may_name_its_apis() -> None:
    replica = ReplicaConfig.model_validate(
        {"name": "x", "url": "http://127.0.0.1:3", "models": ("m",), "apis": ("chat", "responses")}
    )
    assert list(replica_set([replica]).replicas.replicas[0].apis) == ["chat", "responses"]
