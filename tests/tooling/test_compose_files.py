"""The container files, checked without Docker (no engine runs where these tests run).

* Every ``compose*.yaml``, alone and merged over ``compose.yaml`` as ``docker compose -f compose.yaml
  -f compose.X.yaml`` merges it, validates against the Compose Specification's JSON schema
  (``tests/data/compose-spec.json``, vendored; its source is in ``tests/data/README.md``).
* Each luftpause service's ``command`` parses with the CLI's own parser, and the configuration it
  is pointed at (``LUFTPAUSE_CONFIG`` -> a compose ``configs`` entry) loads with
  :func:`luftpause.config.parse_config` and names the project's own services as hosts.
* ``deploy/compose.toml`` is the embedded default with service names for hosts.
* The Dockerfile's stages (and their ``BASE_IMAGE``), user, volume, entrypoint, extension check and
  otel extra; ``tools/image.sh`` naming what it needs.
* Jaeger pinned to a 1.x release, and the Compose release the files need named in docs/operating.md.

Interpolation and merging are done here, after the Compose specification ("Interpolation" and
"Merge and override"), only as far as these files use them: ``${VAR}``, ``${VAR:-default}``,
``${VAR-default}``, ``${VAR:?error}``, ``${VAR?error}`` and ``$$``; mappings merge key by key,
``command``, ``entrypoint`` and ``healthcheck.test`` are replaced, ``volumes`` are merged by mount
target, service ``configs`` by target, other sequences are appended without repeats.
"""

from __future__ import annotations

import ast
import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import pytest
import yaml
from repo_paths import DATA, ROOT

from luftpause.cli import COMMANDS, build_parser
from luftpause.config import EMBEDDED_DEFAULT, Config, RuntimeConfig, parse_config, split_host_port

SCHEMA = json.loads((DATA / "compose-spec.json").read_text())
BASE = ROOT / "compose.yaml"
OVERLAYS = sorted(p for p in ROOT.glob("compose.*.yaml"))
LUFTPAUSE_SERVICES = ("scheduler", "dataplane", "runtime")

# What the overlays require from the environment (their ${VAR:?...}); everything else defaults.
ENV: dict[str, str] = {
    "HOSTED_URL": "https://api.example.com",
    "HOSTED_MODEL": "hosted-model",
    "HOSTED_API_KEY": "not-a-real-key",
}

_VARIABLE = re.compile(
    r"\$(?:(?P<escaped>\$)|\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}"
    r"|(?P<bare>[A-Za-z_][A-Za-z0-9_]*))"
)


class MissingVariable(Exception):
    """A ``${VAR:?message}`` whose variable is unset (or empty, with the colon)."""


def interpolate(value: Any, env: dict[str, str]) -> Any:
    """``value`` (parsed YAML) with every ``$`` expression in its strings resolved from ``env``.

    Raises :class:`MissingVariable` naming the variable and its message.
    """
    if isinstance(value, dict):
        return {key: interpolate(item, env) for key, item in value.items()}
    if isinstance(value, list):
        return [interpolate(item, env) for item in value]
    if not isinstance(value, str):
        return value

    def resolve(match: re.Match[str]) -> str:
        if match["escaped"]:
            return "$"
        name = match["braced"] or match["bare"]
        op, arg = match["op"], match["arg"] or ""
        present = name in env and (env[name] != "" or not (op or "").startswith(":"))
        if op in (":-", "-"):
            return env[name] if present else arg
        if op in (":?", "?") and not present:
            raise MissingVariable(f"{name}: {arg}")
        return env.get(name, "")

    return _VARIABLE.sub(resolve, value)


def _mount_target(volume: Any) -> str:
    if isinstance(volume, dict):
        return str(volume["target"])
    parts = str(volume).split(":")
    return parts[1] if len(parts) > 1 else parts[0]


def _config_target(entry: Any) -> str:
    if isinstance(entry, dict):
        return str(entry.get("target", f"/{entry['source']}"))
    return f"/{entry}"


def merge(base: Any, overlay: Any, path: tuple[str, ...] = ()) -> Any:
    """``overlay`` merged over ``base`` by the rules in this module's docstring."""
    if isinstance(base, dict) and isinstance(overlay, dict):
        merged = dict(base)
        for key, value in overlay.items():
            merged[key] = merge(base[key], value, (*path, key)) if key in base else value
        return merged
    if isinstance(base, list) and isinstance(overlay, list):
        field = path[-1] if path else ""
        if field in ("command", "entrypoint") or path[-2:] == ("healthcheck", "test"):
            return overlay
        key = {"volumes": _mount_target, "configs": _config_target}.get(field)
        if key is not None and len(path) == 3 and path[0] == "services":
            by_key = {key(item): item for item in base}
            by_key.update({key(item): item for item in overlay})
            return list(by_key.values())
        return base + [item for item in overlay if item not in base]
    return overlay


def load(*files: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    """The project ``docker compose -f A -f B ...`` would see: each file parsed (YAML anchors and
    merge keys resolved), interpolated, and merged in order."""
    project: dict[str, Any] = {}
    for file in files:
        document = yaml.safe_load(file.read_text())
        project = merge(project, interpolate(document, ENV if env is None else env))
    return project


def active_services(project: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Services that start without ``--profile`` (those with no profiles)."""
    return {name: svc for name, svc in project["services"].items() if not svc.get("profiles")}


def service_config(project: dict[str, Any], service: dict[str, Any]) -> Config:
    """The luftpause configuration a service reads: the compose config mounted where its
    ``LUFTPAUSE_CONFIG`` points, parsed; ``AssertionError`` when nothing is mounted there."""
    wanted = service["environment"]["LUFTPAUSE_CONFIG"]
    for entry in service.get("configs", []):
        if _config_target(entry) == wanted:
            source = project["configs"][entry["source"] if isinstance(entry, dict) else entry]
            if "file" in source:
                return parse_config((ROOT / source["file"]).read_text(), source["file"])
            return parse_config(source["content"], f"configs.{entry['source']}.content")
    raise AssertionError(f"nothing is mounted at LUFTPAUSE_CONFIG={wanted}")


def is_luftpause(service: dict[str, Any]) -> bool:
    return "luftpause" in str(service.get("image", "")).rsplit("/", 1)[-1].split(":")[0]


def projects() -> list[tuple[str, dict[str, Any]]]:
    return [("compose.yaml", load(BASE))] + [
        (f"compose.yaml + {overlay.name}", load(BASE, overlay)) for overlay in OVERLAYS
    ]


PROJECTS = projects()
PROJECT_IDS = [name for name, _ in PROJECTS]


def test_there_are_the_five_overlays() -> None:
    assert {p.name for p in OVERLAYS} == {
        "compose.ollama.yaml",
        "compose.testbed.yaml",
        "compose.otel.yaml",
        "compose.hosted.yaml",
        "compose.postgres.yaml",
    }


@pytest.mark.parametrize("file", [BASE, *OVERLAYS], ids=lambda p: p.name)
def test_each_file_alone_is_valid_against_the_compose_schema(file: Path) -> None:
    jsonschema.validate(load(file), SCHEMA, cls=jsonschema.Draft7Validator)


@pytest.mark.parametrize(("name", "project"), PROJECTS, ids=PROJECT_IDS)
def test_merged_project_is_valid_against_the_compose_schema(name: str, project: dict[str, Any]) -> None:
    jsonschema.validate(project, SCHEMA, cls=jsonschema.Draft7Validator)


def test_the_schema_check_can_fail() -> None:
    project = load(BASE)
    project["services"]["scheduler"]["ports"] = {"5001": "5001"}  # a mapping where a list belongs
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(project, SCHEMA, cls=jsonschema.Draft7Validator)


@pytest.mark.parametrize(("name", "project"), PROJECTS, ids=PROJECT_IDS)
def test_references_resolve(name: str, project: dict[str, Any]) -> None:
    services = active_services(project)
    for service_name, service in services.items():
        assert "image" in service, f"{service_name}: no image"
        for dependency in service.get("depends_on", {}):
            assert dependency in services, f"{service_name} depends on {dependency}, which does not start"
        for entry in service.get("configs", []):
            source = entry["source"] if isinstance(entry, dict) else entry
            assert source in project.get("configs", {}), f"{service_name}: config {source} undefined"
        for volume in service.get("volumes", []):
            source = str(volume).split(":")[0]
            if not source.startswith((".", "/")):
                assert source in project.get("volumes", {}), f"{service_name}: volume {source} undefined"


@pytest.mark.parametrize(("name", "project"), PROJECTS, ids=PROJECT_IDS)
def test_every_luftpause_command_is_one_the_cli_accepts(name: str, project: dict[str, Any]) -> None:
    commands = []
    for service_name, service in active_services(project).items():
        if not is_luftpause(service):
            continue
        argv = service["command"]
        assert isinstance(argv, list), f"{service_name}: use the exec form, not a shell string"
        assert argv[0] in COMMANDS, f"{service_name}: {argv[0]!r} is not a luftpause command"
        # Only the parser: parse_args exits (SystemExit 2) on an unknown option or a bad value,
        # and nothing is started.
        build_parser(argv[0]).parse_args(argv)
        commands.append(argv[0])
    assert {"scheduler", "dataplane", "runtime"} <= set(commands)


def test_a_command_the_cli_does_not_accept_is_refused() -> None:
    with pytest.raises(SystemExit):
        build_parser("fake-engine").parse_args(["fake-engine", "--port", "not-a-port"])


@pytest.mark.parametrize(("name", "project"), PROJECTS, ids=PROJECT_IDS)
def test_the_three_processes_share_one_config_naming_the_project_services(
    name: str, project: dict[str, Any]
) -> None:
    services = active_services(project)
    configs = [service_config(project, project["services"][s]) for s in LUFTPAUSE_SERVICES]
    assert configs[0] == configs[1] == configs[2]
    config = configs[0]

    def host_port(url_or_address: str) -> tuple[str, int]:
        if "://" in url_or_address:
            parts = urlsplit(url_or_address)
            return parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)
        return split_host_port(url_or_address)

    assert host_port(config.dataplane.scheduler) == ("scheduler", split_host_port(config.scheduler.grpc)[1])
    assert host_port(config.runtime.dataplane) == ("dataplane", split_host_port(config.dataplane.listen)[1])
    for listen in (
        config.scheduler.grpc,
        config.scheduler.http,
        config.dataplane.listen,
        config.runtime.listen,
    ):
        assert split_host_port(listen)[0] == "0.0.0.0", f"{listen}: other containers could not reach it"
    assert config.runtime.state_dir == "/var/lib/luftpause"
    targets = [url for url in [r.url for r in config.replicas] + [s.url for s in config.mcp_servers] if url]
    for url in targets:
        host, port = host_port(url)
        if host in services:
            # A simulated engine or the fake MCP server must listen on the port the config names.
            command = services[host]["command"]
            if is_luftpause(services[host]):
                assert command[command.index("--port") + 1] == str(port), url
        else:
            assert host == "host.docker.internal" or urlsplit(url).scheme == "https", (
                f"{url}: neither a service of this project nor the host nor a hosted endpoint"
            )


def test_compose_toml_is_the_embedded_default_with_service_names() -> None:
    ours = parse_config((ROOT / "deploy" / "compose.toml").read_text(), "deploy/compose.toml")
    default = parse_config(EMBEDDED_DEFAULT)

    def ports(config: Config) -> list[int]:
        listens = (
            config.scheduler.grpc,
            config.scheduler.http,
            config.dataplane.listen,
            config.runtime.listen,
        )
        return [split_host_port(a)[1] for a in listens]

    assert ports(ours) == ports(default)
    assert [(r.name, r.models, r.kind, urlsplit(r.url).port) for r in ours.replicas] == [
        (r.name, r.models, r.kind, urlsplit(r.url).port) for r in default.replicas
    ]
    assert [(s.name, urlsplit(s.url or "").port) for s in ours.mcp_servers] == [
        (s.name, urlsplit(s.url or "").port) for s in default.mcp_servers
    ]
    services = active_services(load(BASE))
    # `luftpause up` starts one fake-engine per replica and one fake-mcp per MCP server.
    simulated = sorted(
        s["command"][0] for s in services.values() if s["command"][0] in ("fake-engine", "fake-mcp")
    )
    assert simulated == ["fake-engine"] * len(default.replicas) + ["fake-mcp"] * len(default.mcp_servers)


def test_runtime_state_is_a_named_volume_at_the_state_dir() -> None:
    project = load(BASE)
    runtime = project["services"]["runtime"]
    state_dir = service_config(project, runtime).runtime.state_dir
    mounts = {_mount_target(v): str(v).split(":")[0] for v in runtime["volumes"]}
    assert mounts.get(state_dir) in project["volumes"]


def test_luftpause_version_pins_the_image_tag() -> None:
    env = {**ENV, "LUFTPAUSE_VERSION": "v1.2.3", "LUFTPAUSE_IMAGE": "ghcr.io/luftpause/luftpause"}
    pinned = active_services(load(BASE, env=env))
    assert all(s["image"] == "ghcr.io/luftpause/luftpause:v1.2.3" for s in pinned.values())
    assert all(s["image"] == "luftpause:dev" for s in active_services(load(BASE)).values())


@pytest.mark.parametrize(("name", "project"), PROJECTS, ids=PROJECT_IDS)
def test_only_a_profiled_service_builds_and_it_never_tags_a_release(
    name: str, project: dict[str, Any]
) -> None:
    """With a pinned version whose pull fails, Compose must not build the working tree and tag it
    as the release: no service that starts on ``up`` has a build section; the one that builds is
    in the ``build`` profile and tags the local ``luftpause:dev`` whatever the environment says."""
    env = {**ENV, "LUFTPAUSE_VERSION": "v1.2.3", "LUFTPAUSE_IMAGE": "ghcr.io/luftpause/luftpause"}
    for project_env in (ENV, env):
        loaded = load(BASE, *([ROOT / name.split(" + ")[1]] if " + " in name else []), env=project_env)
        builders = {n: s for n, s in loaded["services"].items() if "build" in s}
        assert list(builders) == ["image-build"]
        assert builders["image-build"]["profiles"] == ["build"]
        assert builders["image-build"]["image"] == "luftpause:dev"
        for service_name, service in active_services(loaded).items():
            if is_luftpause(service):
                assert service.get("pull_policy") == "missing", service_name


def test_hosted_overlay_needs_its_url_model_and_key_from_the_environment() -> None:
    for name in ("HOSTED_URL", "HOSTED_MODEL"):
        env = {k: v for k, v in ENV.items() if k != name}
        with pytest.raises(MissingVariable, match=name):
            load(BASE, ROOT / "compose.hosted.yaml", env=env)
    project = load(BASE, ROOT / "compose.hosted.yaml")
    hosted = service_config(project, project["services"]["dataplane"]).replica("hosted")
    assert hosted.url == ENV["HOSTED_URL"] and hosted.models == (ENV["HOSTED_MODEL"],)
    assert hosted.api_key_env == "HOSTED_API_KEY"
    for name in ("scheduler", "dataplane"):  # probes and turns carry the key, passed by name
        environment = project["services"][name]["environment"]
        assert "HOSTED_API_KEY" in environment and environment["HOSTED_API_KEY"] is None
    assert "HOSTED_API_KEY" not in project["services"]["runtime"]["environment"]
    assert ENV["HOSTED_API_KEY"] not in json.dumps(project)  # the key is never in the model


def test_ollama_overlay_makes_the_hosts_ollama_the_only_replica() -> None:
    project = load(BASE, ROOT / "compose.ollama.yaml", env={**ENV, "OLLAMA_MODEL": "qwen3:0.6b"})
    config = service_config(project, project["services"]["dataplane"])
    assert [(r.url, r.models) for r in config.replicas] == [
        ("http://host.docker.internal:11434", ("qwen3:0.6b",))
    ]
    assert "engine-a" not in active_services(project) and "engine-b" not in active_services(project)
    for name in ("scheduler", "dataplane"):
        assert "host.docker.internal:host-gateway" in project["services"][name]["extra_hosts"]
    default = load(BASE, ROOT / "compose.ollama.yaml")
    assert service_config(default, default["services"]["dataplane"]).replicas[0].models == ("llama3.2:1b",)


def test_testbed_overlay_fits_two_sglang_replicas_on_one_gpu() -> None:
    project = load(BASE, ROOT / "compose.testbed.yaml")
    sglang = {n: s for n, s in active_services(project).items() if s["image"].startswith("lmsysorg/sglang:")}
    assert len(sglang) == 2
    fractions = []
    devices = set()
    for service in sglang.values():
        argv = service["command"]
        fractions.append(float(argv[argv.index("--mem-fraction-static") + 1]))
        assert "--enable-metrics" in argv  # the scheduler reads the queue from /metrics
        (device,) = service["deploy"]["resources"]["reservations"]["devices"]
        assert device["capabilities"] == ["gpu"]
        devices.add(tuple(device["device_ids"]))
    assert sum(fractions) < 1.0 and len(devices) == 1
    config = service_config(project, project["services"]["dataplane"])
    served = {s["command"][s["command"].index("--served-model-name") + 1] for s in sglang.values()}
    assert {m for r in config.replicas for m in r.models} == served


def test_postgres_overlay_gives_the_runtime_its_database_once_it_is_healthy() -> None:
    project = load(BASE, ROOT / "compose.postgres.yaml")
    runtime = project["services"]["runtime"]
    store = runtime["environment"]["LUFTPAUSE_RUNTIME__STORE"]
    assert store == "postgresql://luftpause:luftpause@postgres:5432/luftpause"
    assert runtime["depends_on"]["postgres"] == {"condition": "service_healthy"}
    postgres = project["services"]["postgres"]
    assert postgres["environment"]["POSTGRES_DB"] == "luftpause" and "healthcheck" in postgres
    # What the runtime is given is a store its configuration accepts.
    assert RuntimeConfig(store=store).store == store


def test_jaeger_is_pinned_to_a_release() -> None:
    """``latest`` would move under the healthcheck (Jaeger 2 has no admin port 14269)."""
    image = load(BASE, ROOT / "compose.otel.yaml")["services"]["jaeger"]["image"]
    name, _, tag = image.rpartition(":")
    assert name == "jaegertracing/all-in-one" and re.fullmatch(r"1\.\d+\.\d+", tag), image
    pinned = load(BASE, ROOT / "compose.otel.yaml", env={**ENV, "JAEGER_VERSION": "1.60.0"})
    assert pinned["services"]["jaeger"]["image"] == "jaegertracing/all-in-one:1.60.0"


def test_the_readme_names_the_compose_release_the_files_need() -> None:
    """Top-level ``configs.content`` came with Docker Compose 2.23.1 (its configs reference); the
    overlays use it, so docs/operating.md and compose.yaml say so."""
    uses_content = [
        p.name for p in OVERLAYS if any("content" in c for c in load(p).get("configs", {}).values())
    ]
    assert uses_content == ["compose.hosted.yaml", "compose.ollama.yaml"]
    for text in ((ROOT / "docs" / "operating.md").read_text(), BASE.read_text()):
        assert "Compose 2.23.1 or later" in text


def test_otel_overlay_points_the_three_processes_at_a_healthy_jaeger() -> None:
    project = load(BASE, ROOT / "compose.otel.yaml")
    jaeger = project["services"]["jaeger"]
    assert jaeger["healthcheck"]["test"][0] == "CMD"
    for name, service in active_services(project).items():
        environment = service.get("environment", {})
        if name in LUFTPAUSE_SERVICES:
            endpoint = environment["OTEL_EXPORTER_OTLP_ENDPOINT"]
            assert urlsplit(endpoint).hostname == "jaeger" and urlsplit(endpoint).port == 4318, name
            # luftpause/observe/tracing.py exports OTLP/HTTP protobuf only and refuses anything else
            assert environment["OTEL_EXPORTER_OTLP_PROTOCOL"] == "http/protobuf", name
            assert service["depends_on"]["jaeger"] == {"condition": "service_healthy"}, name
        else:
            # The simulators make no spans: pointing them at Jaeger would claim they do.
            assert not any(key.startswith("OTEL_") for key in environment), name


# --- the Dockerfile ---------------------------------------------------------------------------


def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` per instruction, continuation lines joined, comments dropped."""
    joined = re.sub(
        r"\\\n", " ", "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    )
    return [
        (parts[0].upper(), parts[1] if len(parts) > 1 else "")
        for line in joined.splitlines()
        if (parts := line.strip().split(None, 1))
    ]


def test_dockerfile_advertises_only_commands_its_baked_configuration_serves() -> None:
    header = (ROOT / "Dockerfile").read_text().split("\n\n")[0]
    match = re.search(r"`docker run IMAGE ([a-z|\-\s#]+?) \.\.\.`", header.replace("\n# ", ""))
    assert match is not None, header
    advertised = [c.strip() for c in match.group(1).split("|")]
    assert set(advertised) <= set(COMMANDS) and "up" not in advertised, advertised


def test_dockerfile_builds_the_extensions_in_a_build_stage_and_runs_as_a_user() -> None:
    instructions = dockerfile_instructions((ROOT / "Dockerfile").read_text())
    stages = [args for op, args in instructions if op == "FROM"]
    assert len(stages) == 2 and stages[0].endswith(" AS build") and stages[1].endswith(" AS runtime")
    # Both from python:X-slim unless BASE_IMAGE says otherwise (tools/image.sh, where none can be pulled).
    arguments = dict(args.split("=", 1) for op, args in instructions if op == "ARG" and "=" in args)
    assert {s.split()[0] for s in stages} == {"${BASE_IMAGE}"}
    assert arguments["BASE_IMAGE"] == "python:${PYTHON_VERSION}-slim"
    runtime = instructions[[op for op, _ in instructions].index("FROM", 1) :]
    runtime_ops = dict(reversed(runtime))  # the first of each instruction in the runtime stage

    assert any(op == "COPY" and args.startswith("--from=build ") for op, args in runtime)
    assert json.loads(runtime_ops["ENTRYPOINT"]) == ["luftpause"]
    assert runtime_ops["USER"] not in ("root", "0")
    assert "/var/lib/luftpause" in runtime_ops["VOLUME"].split()
    # Every extension setup.py builds must be imported in the image, so a failed build fails it.
    setup = ast.parse((ROOT / "setup.py").read_text())
    extensions = next(
        ast.literal_eval(node.value)
        for node in setup.body
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "_EXTENSIONS"
    )
    runs = " ".join(args for op, args in runtime if op == "RUN")
    for module in extensions.values():
        assert module in runs, f"the image does not check that {module} was built"
    # compose.otel.yaml exports spans from this image: the SDK (the otel extra) must be in it; and
    # compose.postgres.yaml keeps the runtime's runs in PostgreSQL: psycopg (the postgresql extra).
    assert "'luftpause[otel,postgresql]'" in runs
    env = dict(
        item.split("=", 1) for op, args in runtime if op == "ENV" for item in shlex.split(args) if "=" in item
    )
    copied = [args.split()[-1] for op, args in runtime if op == "COPY"]
    assert env["LUFTPAUSE_CONFIG"] in copied


def test_the_image_script_names_what_it_needs_when_it_is_missing(tmp_path: Path) -> None:
    """tools/image.sh (the Podman build from a debootstrapped base) on a machine without podman or
    debootstrap: exit 2 saying what to install, before it builds anything."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "dirname"):
        found = shutil.which(tool)
        assert found is not None
        (bin_dir / tool).symlink_to(found)
    done = subprocess.run(
        [str(bin_dir / "bash"), str(ROOT / "tools" / "image.sh")],
        capture_output=True,
        text=True,
        env={"PATH": str(bin_dir)},
        timeout=60,
    )
    assert done.returncode == 2
    assert "podman is not installed (apt-get install podman debootstrap)" in done.stderr
