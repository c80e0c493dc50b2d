"""The Helm chart in ``deploy/helm/luftpause``, rendered and checked offline (no cluster).

Rendered by Helm's own template engine (``helm-python-sdk``: Helm 4's Go library, no ``helm``
binary), as ``helm template`` renders it; every object validated (strict: unknown fields refused)
against the Kubernetes OpenAPI JSON schemas ``kubernetes-validate`` ships, for the oldest
Kubernetes the chart declares and the newest the package knows. Then what the objects must say:
one scheduler replaced by Recreate, N dataplanes behind a ClientIP-affine Service, the runtime's
journal on a StatefulSet volume, one configuration naming the chart's own Services, the token and
engine keys from Secrets, probes on routes that answer on a running stack, resource requests.
Each tool that is absent skips its tests, saying which package to install.
"""

from __future__ import annotations

import itertools
import json
import tomllib
import urllib.request
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from repo_paths import ROOT

from luftpause import __version__
from luftpause.cli import COMMANDS, build_parser
from luftpause.config import Config, parse_config, split_host_port
from luftpause.testkit.launch.stack import Stack

helm = pytest.importorskip(
    "helm_python",
    reason="helm-python-sdk (Helm's engine as a library) is not installed: pip install -e '.[dev]'",
)
kubernetes_validate = pytest.importorskip(
    "kubernetes_validate", reason="kubernetes-validate (the Kubernetes JSON schemas) is not installed"
)

CHART = ROOT / "deploy" / "helm" / "luftpause"
RELEASE = "lp"
PREFIX = "lp-luftpause"
CONFIG_PATH = "/etc/luftpause/luftpause.toml"
LUFTPAUSE = ("scheduler", "dataplane", "runtime")


def render(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The chart's objects (``helm template lp CHART`` with ``values`` over values.yaml)."""
    chart = helm.Chart.load(str(CHART))
    manifests = chart.render(values, name=RELEASE, namespace="ns", is_install=True)
    return [
        doc
        for name, text in sorted(manifests.items())
        if name.endswith(".yaml")
        for doc in yaml.safe_load_all(text)
        if doc
    ]


def by_kind(objects: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def workloads(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Deployments and StatefulSets by their component label."""
    return {
        o["metadata"]["labels"]["app.kubernetes.io/component"]: o
        for o in objects
        if o["kind"] in ("Deployment", "StatefulSet")
    }


def container(workload: dict[str, Any]) -> dict[str, Any]:
    (only,) = workload["spec"]["template"]["spec"]["containers"]
    return only  # type: ignore[no-any-return]


def config_of(objects: list[dict[str, Any]]) -> Config:
    (config_map,) = by_kind(objects, "ConfigMap").values()
    return parse_config(config_map["data"]["luftpause.toml"], "ConfigMap luftpause.toml")


def service_port(
    objects: list[dict[str, Any]], host: str, port: int
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The chart's Service named ``host`` and its port ``port``; AssertionError when absent."""
    services = by_kind(objects, "Service")
    assert host in services, f"{host}: not a Service of the chart ({sorted(services)})"
    (entry,) = [p for p in services[host]["spec"]["ports"] if p["port"] == port]
    return services[host], entry


def serves(objects: list[dict[str, Any]], service: dict[str, Any], entry: dict[str, Any]) -> bool:
    """True when ``service`` selects a workload whose container has the named target port."""
    selector = service["spec"]["selector"]
    for workload in workloads(objects).values():
        labels = workload["spec"]["template"]["metadata"]["labels"]
        if selector.items() <= labels.items():
            names = {p["name"]: p["containerPort"] for p in container(workload)["ports"]}
            target = entry["targetPort"]
            return target in names or target in names.values()
    return False


def oldest_kubernetes() -> str:
    declared = yaml.safe_load((CHART / "Chart.yaml").read_text())["kubeVersion"]
    return declared.removeprefix(">=").split("-")[0].rsplit(".", 1)[0]  # ">=1.25.0-0" -> "1.25"


DEFAULT = render()
SECRETS = {"token": {"value": "tok-123"}, "engineKeys": {"values": {"ENGINE_API_KEY": "key-456"}}}
POOL = """
[[replicas]]
name = "sglang-0"
url = "http://sglang-0.sglang:30000"
models = ["qwen2.5-0.5b-instruct"]
api_key_env = "ENGINE_API_KEY"
"""


# --- the chart as Helm and Kubernetes see it ------------------------------------------------------


def test_helm_lints_the_chart_without_a_warning() -> None:
    result = helm.lint(str(CHART))
    assert result["errors"] == []
    assert [m for m in result["messages"] if m["severity"] > 1] == [], result["messages"]  # 1: info


@pytest.mark.parametrize("version", [oldest_kubernetes(), kubernetes_validate.latest_version()])
@pytest.mark.parametrize(
    "values",
    [None, SECRETS, {"simulated": {"enabled": False}, "pool": POOL}],
    ids=["default", "secrets", "pool"],
)
def test_every_object_is_valid_against_the_kubernetes_schemas(
    version: str, values: dict[str, Any] | None
) -> None:
    objects = render(values)
    assert len(objects) >= 7  # ConfigMap, 3 workloads, 3 Services (and the simulated pool)
    for obj in objects:
        kubernetes_validate.validate(obj, version, strict=True)


def test_the_schema_check_can_fail() -> None:
    broken = json.loads(json.dumps(workloads(DEFAULT)["dataplane"]))
    broken["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, kubernetes_validate.latest_version(), strict=True)
    misspelt = json.loads(json.dumps(workloads(DEFAULT)["scheduler"]))
    misspelt["spec"]["stratgy"] = misspelt["spec"].pop("strategy")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(misspelt, kubernetes_validate.latest_version(), strict=True)


def test_the_image_is_the_release_of_this_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == __version__
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert pyproject["project"]["version"] == __version__
    images = {container(w)["image"] for w in workloads(DEFAULT).values()}
    assert images == {f"ghcr.io/luftpause/luftpause:v{__version__}"}  # what tools/release.sh pushes


# --- the three processes --------------------------------------------------------------------------


def test_the_scheduler_is_one_replica_replaced_by_recreate() -> None:
    scheduler = workloads(DEFAULT)["scheduler"]
    assert scheduler["kind"] == "Deployment"
    assert scheduler["spec"]["replicas"] == 1
    assert scheduler["spec"]["strategy"] == {"type": "Recreate"}


def test_dataplanes_are_n_replicas_behind_a_client_affine_service() -> None:
    objects = render({"dataplane": {"replicas": 3}})
    dataplane = workloads(objects)["dataplane"]
    assert dataplane["kind"] == "Deployment" and dataplane["spec"]["replicas"] == 3
    service, entry = service_port(objects, f"{PREFIX}-dataplane", 8080)
    assert service["spec"]["sessionAffinity"] == "ClientIP"
    assert service["spec"]["sessionAffinityConfig"]["clientIP"]["timeoutSeconds"] > 0
    assert serves(objects, service, entry)


def test_the_runtime_is_a_statefulset_with_its_journal_on_a_volume() -> None:
    runtime = workloads(DEFAULT)["runtime"]
    assert runtime["kind"] == "StatefulSet" and runtime["spec"]["replicas"] == 1
    assert runtime["spec"]["serviceName"] in by_kind(DEFAULT, "Service")
    (claim,) = runtime["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    mounts = {m["name"]: m["mountPath"] for m in container(runtime)["volumeMounts"]}
    assert mounts[claim["metadata"]["name"]] == config_of(DEFAULT).runtime.state_dir
    # The image's user owns what it writes there.
    assert runtime["spec"]["template"]["spec"]["securityContext"]["fsGroup"] == 10001


def test_runtimes_on_postgresql_share_the_url_from_a_secret_and_reach_each_other_by_pod_ip() -> None:
    objects = render({"runtime": {"replicas": 3, "store": {"existingSecret": "lp-db", "key": "url"}}})
    runtime = workloads(objects)["runtime"]
    assert runtime["spec"]["replicas"] == 3
    from_secret, _ = env_sources(runtime)
    assert from_secret["LUFTPAUSE_RUNTIME__STORE"] == {"name": "lp-db", "key": "url"}
    # Any runtime answers for any run (a call is forwarded to the runtime holding it, at the URL it
    # advertises: its pod's address), so the Service needs no client affinity.
    service = by_kind(objects, "Service")[runtime["spec"]["serviceName"]]
    assert "sessionAffinity" not in service["spec"]
    env = {e["name"]: e for e in container(runtime)["env"]}
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    _, port = split_host_port(config_of(objects).runtime.listen)
    assert env["LUFTPAUSE_RUNTIME__ADVERTISE_URL"]["value"] == f"http://$(POD_IP):{port}"
    assert list(env).index("POD_IP") < list(env).index("LUFTPAUSE_RUNTIME__ADVERTISE_URL")
    assert "LUFTPAUSE_RUNTIME__STORE" not in env_sources(workloads(DEFAULT)["runtime"])[0]
    with pytest.raises(helm.HelmError, match=r"runtime\.replicas > 1 needs runtime\.store\.existingSecret"):
        render({"runtime": {"replicas": 2}})


@pytest.mark.parametrize(
    "values", [None, {"simulated": {"enabled": False}, "pool": POOL}], ids=["default", "pool"]
)
def test_one_configmap_configures_every_process_and_names_the_chart_s_services(
    values: dict[str, Any] | None,
) -> None:
    objects = render(values)
    config = config_of(objects)
    (config_map,) = by_kind(objects, "ConfigMap")
    for name in LUFTPAUSE:
        spec = workloads(objects)[name]["spec"]["template"]["spec"]
        one = container(workloads(objects)[name])
        environment = {e["name"]: e.get("value") for e in one["env"]}
        assert environment["LUFTPAUSE_CONFIG"] == CONFIG_PATH
        (volume,) = [v for v in spec["volumes"] if "configMap" in v]
        assert volume["configMap"]["name"] == config_map
        (mount,) = [m for m in one["volumeMounts"] if m["name"] == volume["name"]]
        assert CONFIG_PATH.startswith(mount["mountPath"] + "/")
    for listen in (
        config.scheduler.grpc,
        config.scheduler.http,
        config.dataplane.listen,
        config.runtime.listen,
    ):
        assert split_host_port(listen)[0] == "0.0.0.0", f"{listen}: other pods could not reach it"
    # Each address one process reaches another at is a Service of the chart serving that port.
    host, port = split_host_port(config.dataplane.scheduler)
    assert serves(objects, *service_port(objects, host, port)) and host == f"{PREFIX}-scheduler"
    url = urlsplit(config.runtime.dataplane)
    assert serves(objects, *service_port(objects, url.hostname or "", url.port or 80))
    assert url.hostname == f"{PREFIX}-dataplane"
    if values is None:  # the simulated pool: every replica and MCP server is a Service here
        for target in [r.url for r in config.replicas] + [s.url or "" for s in config.mcp_servers]:
            parts = urlsplit(target)
            assert serves(objects, *service_port(objects, parts.hostname or "", parts.port or 80)), target
    else:
        assert [r.name for r in config.replicas] == ["sglang-0"]
        assert not {"engine-0", "engine-1", "mcp"} & set(workloads(objects))


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"simulated": {"enabled": False}}, "pool is empty"),
        ({"pool": POOL}, "set simulated.enabled=false"),
    ],
)
def test_a_pool_that_is_missing_or_doubled_is_refused_at_render(values: dict[str, Any], message: str) -> None:
    with pytest.raises(helm.HelmError, match=message):
        render(values)


@pytest.mark.parametrize("values", [None, SECRETS], ids=["default", "secrets"])
def test_every_container_runs_a_command_the_cli_accepts(values: dict[str, Any] | None) -> None:
    for name, workload in workloads(render(values)).items():
        argv = container(workload)["args"]
        assert argv[0] in COMMANDS, name
        build_parser(argv[0]).parse_args(argv)  # SystemExit on an option the command lacks


# --- secrets ---------------------------------------------------------------------------------------


def env_sources(workload: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    one = container(workload)
    from_secret = {
        e["name"]: e["valueFrom"]["secretKeyRef"]
        for e in one["env"]
        if "secretKeyRef" in e.get("valueFrom", {})
    }
    return from_secret, [s["secretRef"]["name"] for s in one.get("envFrom", [])]


def test_the_token_and_engine_keys_come_from_secrets_and_nowhere_else() -> None:
    objects = render(SECRETS)
    secrets = by_kind(objects, "Secret")
    token_secret, keys_secret = f"{PREFIX}-token", f"{PREFIX}-engine-keys"
    assert secrets[token_secret]["stringData"] == {"LUFTPAUSE_TOKEN": "tok-123"}
    assert secrets[keys_secret]["stringData"] == {"ENGINE_API_KEY": "key-456"}
    for name in LUFTPAUSE:
        from_secret, env_from = env_sources(workloads(objects)[name])
        assert from_secret == {"LUFTPAUSE_TOKEN": {"name": token_secret, "key": "LUFTPAUSE_TOKEN"}}, name
        # Probes (scheduler) and turns (dataplane) carry the engines' keys; the runtime never does.
        assert env_from == ([keys_secret] if name != "runtime" else []), name
    others = json.dumps([o for o in objects if o["kind"] != "Secret"])
    assert "tok-123" not in others and "key-456" not in others


def test_existing_secrets_are_referenced_not_made() -> None:
    objects = render({"token": {"existingSecret": "my-token"}, "engineKeys": {"existingSecret": "my-keys"}})
    assert by_kind(objects, "Secret") == {}
    from_secret, env_from = env_sources(workloads(objects)["dataplane"])
    assert from_secret["LUFTPAUSE_TOKEN"]["name"] == "my-token" and env_from == ["my-keys"]


def test_without_secrets_no_secret_is_made_or_referenced() -> None:
    assert by_kind(DEFAULT, "Secret") == {}
    for name in LUFTPAUSE:
        assert env_sources(workloads(DEFAULT)[name]) == ({}, [])


# --- probes and resources ---------------------------------------------------------------------------


def test_every_container_has_probes_on_its_own_ports_and_resource_requests() -> None:
    for name, workload in workloads(DEFAULT).items():
        one = container(workload)
        ports = {p["name"] for p in one["ports"]}
        for probe in ("livenessProbe", "readinessProbe"):
            check = one[probe]
            target = (check.get("httpGet") or check.get("tcpSocket"))["port"]
            assert target in ports, f"{name} {probe}: port {target!r} is not one of {ports}"
        requests = one["resources"]["requests"]
        assert requests.get("cpu") and requests.get("memory"), name


@pytest.mark.integration
def test_the_probed_routes_answer_on_a_running_stack(stack: Stack) -> None:
    """Each HTTP probe's path, asked of the same process of the shared stack (real processes on
    loopback), answers 200 without a token."""
    bases = {
        "scheduler": stack.status_url.removesuffix("/status"),
        "dataplane": stack.dataplane_url,
        "runtime": stack.runtime_url.removesuffix("/mcp"),
        "engine-0": stack.engine_urls[0],
        "engine-1": stack.engine_urls[1],
    }
    probed = 0
    for name, workload in workloads(DEFAULT).items():
        one = container(workload)
        for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
            http = one.get(probe, {}).get("httpGet")
            if http is None:
                continue
            with urllib.request.urlopen(bases[name] + http["path"], timeout=10) as response:
                assert response.status == 200, (name, probe)
            probed += 1
    assert probed >= 8


# --- a chart ready for a cluster: monitoring, disruptions, scaling, network policies, its schema ---

TOGGLES: dict[str, dict[str, Any]] = {
    "pool": {"simulated": {"enabled": False}, "pool": POOL},
    "secrets": SECRETS,
    "serviceMonitor": {"metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "kps"}}}},
    "noPodDisruptionBudget": {"dataplane": {"podDisruptionBudget": {"enabled": False}}},
    "autoscaling": {"dataplane": {"autoscaling": {"enabled": True}}},
    "networkPolicy": {"networkPolicy": {"enabled": True}},
    "discovery": {"scheduler": {"discovery": {"enabled": True, "models": ["qwen2.5-0.5b-instruct"]}}},
}
"""Each documented switch of values.yaml, as the values that turn it (away from its default)."""

CRDS = {("monitoring.coreos.com/v1", "ServiceMonitor")}
"""Kinds of the Prometheus Operator's CRDs: not in the Kubernetes schemas; checked by shape below."""


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in over.items():
        merged[key] = _merge(merged[key], value) if isinstance(value, dict) and key in merged else value
    return merged


def combination(names: tuple[str, ...]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for name in names:
        values = _merge(values, TOGGLES[name])
    return values


COMBINATIONS = [
    names for count in range(len(TOGGLES) + 1) for names in itertools.combinations(TOGGLES, count)
]
_VALIDATED: set[tuple[str, str]] = set()


@pytest.mark.parametrize("names", COMBINATIONS, ids=lambda names: "+".join(names) or "default")
def test_every_documented_combination_renders_and_validates(names: tuple[str, ...]) -> None:
    """All 128 combinations of the switches, each object valid (strict) for the oldest Kubernetes
    the chart declares and the newest the package knows (an object already checked in an earlier
    combination is not checked again)."""
    objects = render(combination(names))
    kinds = {o["kind"] for o in objects}
    assert ("ServiceMonitor" in kinds) == ("serviceMonitor" in names)
    assert ("PodDisruptionBudget" in kinds) == ("noPodDisruptionBudget" not in names)
    assert ("HorizontalPodAutoscaler" in kinds) == ("autoscaling" in names)
    assert ("NetworkPolicy" in kinds) == ("networkPolicy" in names)
    assert ("RoleBinding" in kinds) == ("discovery" in names)
    assert (config_of(objects).scheduler.discovery is not None) == ("discovery" in names)
    for obj in objects:
        if (obj["apiVersion"], obj["kind"]) in CRDS:
            continue
        text = json.dumps(obj, sort_keys=True)
        for version in (oldest_kubernetes(), kubernetes_validate.latest_version()):
            if (text, version) not in _VALIDATED:
                kubernetes_validate.validate(obj, version, strict=True)
                _VALIDATED.add((text, version))


def test_values_yaml_fits_its_schema_and_a_value_outside_it_is_refused_at_render() -> None:
    import jsonschema

    schema = json.loads((CHART / "values.schema.json").read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    jsonschema.validate(yaml.safe_load((CHART / "values.yaml").read_text()), schema)
    for bad in (
        {"dataplane": {"replicas": "two"}},
        {"dataplane": {"autoscaling": {"enabled": True, "targetCPUUtilizationPercentage": 150}}},
        {"dataplne": {"replicas": 2}},  # a misspelt section
        {"metrics": {"serviceMonitor": {"interval": "soon"}}},
        {"networkPolicy": {"runtimeClients": "everyone"}},
    ):
        with pytest.raises(Exception, match="values don't meet the specifications of the schema"):
            render(bad)


def test_the_service_monitor_scrapes_the_metrics_port_of_each_process() -> None:
    objects = render(TOGGLES["serviceMonitor"])
    (monitor,) = by_kind(objects, "ServiceMonitor").values()
    assert monitor["metadata"]["labels"]["release"] == "kps"
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["ns"]}
    (endpoint,) = monitor["spec"]["endpoints"]
    assert (endpoint["port"], endpoint["path"]) == ("http", "/metrics")
    selected = {}
    for service in by_kind(objects, "Service").values():
        labels = service["metadata"]["labels"]
        if all(labels.get(e["key"]) in e["values"] for e in monitor["spec"]["selector"]["matchExpressions"]):
            selected[labels["app.kubernetes.io/component"]] = service
    assert set(selected) == set(LUFTPAUSE)  # not the simulated engines
    for component, service in selected.items():
        (port,) = [p for p in service["spec"]["ports"] if p["name"] == "http"]
        assert serves(objects, service, port), component
        assert port["port"] == {"scheduler": 5001, "dataplane": 8080, "runtime": 7000}[component]


def test_the_dataplane_scales_by_its_autoscaler_which_then_owns_its_replicas() -> None:
    objects = render(TOGGLES["autoscaling"])
    (hpa,) = by_kind(objects, "HorizontalPodAutoscaler").values()
    dataplane = workloads(objects)["dataplane"]
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": dataplane["metadata"]["name"],
    }
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 8)
    assert "replicas" not in dataplane["spec"]  # else every upgrade would reset the autoscaler's count
    assert container(dataplane)["resources"]["requests"]["cpu"]  # CPU utilization needs a request
    assert workloads(DEFAULT)["dataplane"]["spec"]["replicas"] == 2


def test_a_node_drain_takes_one_dataplane_at_a_time_and_never_blocks_on_the_single_pods() -> None:
    (budget,) = by_kind(DEFAULT, "PodDisruptionBudget").values()
    assert budget["spec"]["maxUnavailable"] == 1
    selected = [
        component
        for component, workload in workloads(DEFAULT).items()
        if budget["spec"]["selector"]["matchLabels"].items()
        <= workload["spec"]["template"]["metadata"]["labels"].items()
    ]
    assert selected == ["dataplane"]


def _admits(policy: dict[str, Any], pod_labels: dict[str, str], port_name: str) -> bool:
    """Whether ``policy`` lets a pod of this release with ``pod_labels`` (same namespace) in on
    the named port."""
    for rule in policy["spec"]["ingress"]:
        if not any(p["port"] == port_name for p in rule.get("ports", [])):
            continue
        for peer in rule["from"]:
            if "podSelector" in peer and "namespaceSelector" not in peer:
                if peer["podSelector"]["matchLabels"].items() <= pod_labels.items():
                    return True
    return False


def test_network_policies_let_in_only_who_needs_the_scheduler_and_the_runtime() -> None:
    objects = render(TOGGLES["networkPolicy"])
    policies = by_kind(objects, "NetworkPolicy")
    pods = {c: w["spec"]["template"]["metadata"]["labels"] for c, w in workloads(objects).items()}
    scheduler, runtime = policies[f"{PREFIX}-scheduler"], policies[f"{PREFIX}-runtime"]
    for policy, component in ((scheduler, "scheduler"), (runtime, "runtime")):
        assert policy["spec"]["policyTypes"] == ["Ingress"]
        assert policy["spec"]["podSelector"]["matchLabels"].items() <= pods[component].items()
        ports = {p["name"] for p in container(workloads(objects)[component])["ports"]}
        assert {p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]} <= ports
    # the scheduler's gRPC: the dataplanes, and no other pod of the release
    assert _admits(scheduler, pods["dataplane"], "grpc")
    assert not any(_admits(scheduler, pods[c], "grpc") for c in ("runtime", "scheduler"))
    assert not _admits(scheduler, pods["dataplane"], "http")  # the status port: scrapers only
    # the runtime: its labelled clients; the dataplane and the scheduler do not call it
    assert _admits(runtime, {"luftpause.io/runtime-client": "true"}, "http")
    assert not any(_admits(runtime, pods[c], "http") for c in ("dataplane", "scheduler"))
    scrapers = [
        peer for rule in scheduler["spec"]["ingress"] for peer in rule["from"] if "namespaceSelector" in peer
    ]
    assert scrapers == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    # with no clients and no scrapers named, the runtime takes no ingress at all
    closed = render({"networkPolicy": {"enabled": True, "runtimeClients": [], "metricsScrapers": []}})
    assert by_kind(closed, "NetworkPolicy")[f"{PREFIX}-runtime"]["spec"]["ingress"] == []
    assert len(by_kind(closed, "NetworkPolicy")[f"{PREFIX}-scheduler"]["spec"]["ingress"]) == 1


def test_discovery_lists_pods_with_a_service_account_that_may_only_read_pods_there() -> None:
    objects = render(_merge(TOGGLES["discovery"], {"scheduler": {"discovery": {"namespace": "gpu"}}}))
    discovery = config_of(objects).scheduler.discovery
    assert discovery is not None
    assert (discovery.namespace, discovery.label_selector, discovery.port) == ("gpu", "app=sglang", 30000)
    assert discovery.models == ("qwen2.5-0.5b-instruct",)
    (account,) = by_kind(objects, "ServiceAccount").values()
    scheduler = workloads(objects)["scheduler"]
    assert scheduler["spec"]["template"]["spec"]["serviceAccountName"] == account["metadata"]["name"]
    (role,) = by_kind(objects, "Role").values()
    assert role["metadata"]["namespace"] == "gpu"
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}]
    (binding,) = by_kind(objects, "RoleBinding").values()
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": "ns"}
    ]
    assert "serviceAccountName" not in workloads(DEFAULT)["scheduler"]["spec"]["template"]["spec"]
