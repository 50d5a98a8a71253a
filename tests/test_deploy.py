"""deploy/ agrees with the gateway: the dashboard, the compose stack, the manifests.

Docker and a cluster cannot run on the test machines, so these tests read the files and hold
them against what the gateway really does:

- every YAML/JSON file under deploy/ parses;
- the Dockerfile: multi-stage, a non-root numeric USER, a HEALTHCHECK on /healthz at the EXPOSEd
  port, an ENTRYPOINT that `gateway.cli`'s own parser accepts, a build context that holds what
  the wheel is built from;
- compose and Kubernetes: ports, probe paths, mounted paths and environment variable names agree
  with each other and with the gateway; both gateway configs pass `load_config`, and their Redis
  address names the Redis that the same stack starts (in Kubernetes, the sentinels of a Redis
  StatefulSet, whose init script is run against real `redis-server` processes);
- Envoy: the Kubernetes ConfigMap carries deploy/envoy/envoy.yaml verbatim, its cluster resolves
  the gateway pods' headless Service on their port and checks their readiness path, clients'
  Service reaches Envoy; retries, timeouts, the WebSocket and the hash order are as documented
  (tests/test_envoy.py runs the file with the real binary);
- the Grafana dashboard: provisioned datasource and path line up; every metric its queries use is
  exposed by a real `compactgate serve` process after real traffic (official `openai` client,
  the fake upstream, one compacted request and one answered with a context error).
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import openai
import pytest
import redis
import yaml

import gateway.cli
from gateway.config import Config, load_config
from gateway.store import parse_store_url
from tests.configs import one_model
from tests.conftest import REPO_ROOT, RunningProcess, Starter, free_port, start_process
from tests.fake_upstream import FakeUpstream
from tests.redis_server import READY, REPLICA_READY, redis_argv

DEPLOY = REPO_ROOT / "deploy"
DOCKERFILE = DEPLOY / "Dockerfile"
COMPOSE = DEPLOY / "docker-compose.yml"
K8S = DEPLOY / "k8s"
ENVOY = DEPLOY / "envoy" / "envoy.yaml"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "compactgate.json"
DATASOURCES = DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yml"
DASHBOARD_PROVIDERS = DEPLOY / "grafana" / "provisioning" / "dashboards" / "dashboards.yml"

# What the dashboard must show (design D17), as the sample names PromQL uses.
REQUIRED_METRICS = {
    "compactgate_requests_total",
    "compactgate_request_duration_seconds_bucket",
    "compactgate_upstream_duration_seconds_bucket",
    "compactgate_gateway_overhead_seconds_bucket",
    "compactgate_tokens_before_total",
    "compactgate_tokens_after_total",
    "compactgate_tokens_saved_total",
    "compactgate_compactions_total",
    "compactgate_context_errors_total",
    "compactgate_emergency_retries_total",
    "compactgate_context_errors_avoided_total",
    "compactgate_summary_cache_total",
    "compactgate_summarizer_calls_total",
    "compactgate_summarizer_duration_seconds_bucket",
    "compactgate_estimate_error_ratio_bucket",
    "compactgate_inflight_requests",
    "compactgate_store_errors_total",
}


# -- reading the files ---------------------------------------------------------------------------


def yaml_docs(path: Path) -> list[Any]:
    with path.open(encoding="utf-8") as handle:
        return [doc for doc in yaml.safe_load_all(handle) if doc is not None]


def yaml_doc(path: Path) -> Any:
    (doc,) = yaml_docs(path)
    return doc


def k8s_objects() -> list[dict[str, Any]]:
    objects = []
    for path in sorted(K8S.glob("*.yaml")):
        if path.name != "kustomization.yaml":
            objects += yaml_docs(path)
    return objects


def k8s_object(kind: str, name: str) -> dict[str, Any]:
    found = [o for o in k8s_objects() if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name!r} in deploy/k8s, found {len(found)}"
    return found[0]


def gateway_deployment() -> dict[str, Any]:
    return k8s_object("Deployment", "compactgate")


def gateway_container() -> dict[str, Any]:
    (container,) = gateway_deployment()["spec"]["template"]["spec"]["containers"]
    return container


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [args for kw, args in self.instructions if kw == keyword]

    def one(self, keyword: str) -> str:
        found = self.all(keyword)
        assert len(found) == 1, f"stage {self.name or self.base}: {len(found)} {keyword} lines"
        return found[0]


def dockerfile_stages(text: str) -> list[Stage]:
    """Instructions grouped by stage; comments dropped, `\\` continuations joined."""
    logical: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    assert not pending, "the Dockerfile ends inside a continued line"
    stages: list[Stage] = []
    for line in logical:
        keyword, _, args = line.partition(" ")
        keyword, args = keyword.upper(), args.strip()
        if keyword == "FROM":
            words = args.split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append(Stage(base=words[0], name=name))
        else:
            assert stages, f"{keyword} before the first FROM"
            stages[-1].instructions.append((keyword, args))
    return stages


def exec_form(args: str) -> list[str]:
    value = json.loads(args)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), args
    return value


def entrypoint() -> list[str]:
    return exec_form(dockerfile_stages(DOCKERFILE.read_text())[-1].one("ENTRYPOINT"))


def flag(argv: list[str], name: str) -> str:
    assert name in argv, f"{name} missing from {argv}"
    return argv[argv.index(name) + 1]


def exposed_port() -> int:
    (port,) = dockerfile_stages(DOCKERFILE.read_text())[-1].one("EXPOSE").split()
    return int(port.removesuffix("/tcp"))


def healthcheck_command() -> list[str]:
    args = dockerfile_stages(DOCKERFILE.read_text())[-1].one("HEALTHCHECK")
    _, _, command = args.partition(" CMD ")
    assert command, f"HEALTHCHECK without CMD: {args}"
    return exec_form(command.strip())


def compose() -> dict[str, Any]:
    return yaml_doc(COMPOSE)


def compose_default(value: str) -> str:
    """A compose value with `${VAR:-default}` replaced by its default (VAR unset)."""
    return re.sub(r"\$\{[A-Za-z_][A-Za-z0-9_]*:-([^}]*)\}", r"\1", value)


def compose_mounts(service: dict[str, Any]) -> dict[str, Path]:
    """Bind mounts of a compose service: container path -> path in the repository."""
    mounts = {}
    for volume in service.get("volumes", []):
        source, target, *_ = volume.split(":")
        assert source.startswith("./"), f"{volume}: expected a bind mount of a file in deploy/"
        mounts[target] = (DEPLOY / source).resolve()
    return mounts


def container_ports(service: dict[str, Any]) -> list[int]:
    return [int(compose_default(str(p)).rsplit(":", 1)[-1].split("/")[0]) for p in service["ports"]]


def published(port: Any) -> tuple[str | None, str]:
    """A compose `ports` entry's host address (None: every interface) and host port(s)."""
    parts = compose_default(str(port)).split(":")
    return (parts[0], parts[1]) if len(parts) == 3 else (None, parts[0])


def compose_gateway_config() -> Config:
    gw = compose()["services"]["gateway"]
    return load_config(compose_mounts(gw)[gw["environment"]["COMPACTGATE_CONFIG"]], environ={})


def configmap_config(tmp_path: Path) -> Path:
    """The gateway config inside the ConfigMap, written out as the file the pods mount."""
    container = gateway_container()
    config_path = Path(env_value(container, "COMPACTGATE_CONFIG"))
    (mount,) = [m for m in container["volumeMounts"] if config_path.parent == Path(m["mountPath"])]
    (volume,) = [
        v
        for v in gateway_deployment()["spec"]["template"]["spec"]["volumes"]
        if v["name"] == mount["name"]
    ]
    configmap = k8s_object("ConfigMap", volume["configMap"]["name"])
    assert config_path.name in configmap["data"], (
        f"COMPACTGATE_CONFIG={config_path} but the ConfigMap has keys {sorted(configmap['data'])}"
    )
    path = tmp_path / config_path.name
    path.write_text(configmap["data"][config_path.name])
    return path


def env_value(container: dict[str, Any], name: str) -> str:
    (entry,) = [e for e in container["env"] if e["name"] == name]
    return entry["value"]


def env_vars_the_gateway_reads() -> set[str]:
    """Upper-case string literals in gateway modules that read the environment."""
    names: set[str] = set()
    for path in (REPO_ROOT / "gateway").rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        if "environ" in text or "getenv" in text:
            names |= set(re.findall(r"""["']([A-Z][A-Z0-9]*_[A-Z0-9_]+)["']""", text))
    return names


def interpolated_vars(config_text: str) -> dict[str, bool]:
    """`${VAR}` references in a gateway config: name -> whether it has a `:-default`."""
    found: dict[str, bool] = {}
    for name, default in re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(:-)?", config_text):
        found[name] = found.get(name, True) and bool(default)
    return found


def redis_address(config: Config) -> tuple[str, int]:
    url = urlsplit(config.store)
    assert url.scheme == "redis", f"store is {config.store}; the replicas need a shared Redis"
    assert url.hostname is not None
    return url.hostname, url.port or 6379


# -- the dashboard's queries ---------------------------------------------------------------------


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def walk_panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from walk_panels(panel.get("panels", []))


def dashboard_queries() -> list[str]:
    """Every PromQL expression: panel targets and template variable queries."""
    queries = [
        target["expr"]
        for panel in walk_panels(dashboard()["panels"])
        for target in panel.get("targets", [])
    ]
    for variable in dashboard()["templating"]["list"]:
        query = variable.get("query")
        if variable.get("type") == "query":
            queries.append(query["query"] if isinstance(query, dict) else query)
    return queries


METRIC_NAME = re.compile(r"\bcompactgate_[A-Za-z0-9_]+")


def metric_names(query: str) -> set[str]:
    return set(METRIC_NAME.findall(query))


def label_names(query: str) -> set[str]:
    """Labels a query matches on or groups by (a regex reading of the PromQL we write)."""
    labels: set[str] = set()
    for matchers in re.findall(r"\{([^{}]*)\}", query):
        labels |= set(re.findall(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)", matchers))
    for grouping in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", query):
        labels |= {name.strip() for name in grouping.split(",") if name.strip()}
    labels |= set(re.findall(r"label_values\(\s*[A-Za-z0-9_:]+\s*,\s*([A-Za-z_]\w*)\s*\)", query))
    return labels


# -- files parse -----------------------------------------------------------------------------


def test_every_yaml_and_json_file_under_deploy_parses() -> None:
    yaml_files = [*DEPLOY.rglob("*.yml"), *DEPLOY.rglob("*.yaml")]
    json_files = list(DEPLOY.rglob("*.json"))
    assert len(yaml_files) >= 10 and json_files
    for path in yaml_files:
        assert yaml_docs(path), f"{path} is empty"
    for path in json_files:
        json.loads(path.read_text())


# -- Dockerfile ------------------------------------------------------------------------------


def test_dockerfile_is_multi_stage_and_the_runtime_installs_the_builders_wheels() -> None:
    stages = dockerfile_stages(DOCKERFILE.read_text())
    assert len(stages) >= 2
    builder, runtime = stages[0], stages[-1]
    assert runtime.base == "python:3.11-slim"
    assert any("pip wheel" in run for run in builder.all("RUN"))
    assert builder.name is not None
    assert any(f"from={builder.name}" in run for run in runtime.all("RUN")) or any(
        f"--from={builder.name}" in copy for copy in runtime.all("COPY")
    ), "the runtime stage takes nothing from the builder"


def test_final_stage_runs_as_a_numeric_non_root_user_matching_the_pods() -> None:
    users = dockerfile_stages(DOCKERFILE.read_text())[-1].all("USER")
    assert users, "the final stage has no USER: the gateway would run as root"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) != 0, "USER must be a non-zero UID for runAsNonRoot"
    pod = gateway_deployment()["spec"]["template"]["spec"]["securityContext"]
    assert pod["runAsNonRoot"] is True
    assert pod["runAsUser"] == int(uid)
    if gid:
        assert pod["runAsGroup"] == int(gid)


def test_healthcheck_asks_healthz_on_the_port_the_entrypoint_serves_and_exposes() -> None:
    command = healthcheck_command()
    assert command[0] in ("python", "python3"), "python:3.11-slim has no curl or wget"
    (url,) = re.findall(r"https?://[^'\"\s]+", " ".join(command))
    parts = urlsplit(url)
    assert parts.path == "/healthz"
    assert parts.port == exposed_port() == int(flag(entrypoint(), "--port"))
    assert flag(entrypoint(), "--host") == "0.0.0.0", "bound to loopback it is unreachable"


def test_entrypoint_is_the_installed_script_and_its_cli_accepts_the_arguments(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    argv = entrypoint()
    scripts = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts.get(argv[0]) == "gateway.cli:main"
    # gateway.cli.main's own parser, with `serve` itself replaced by a recorder.
    seen = []
    monkeypatch.setattr(gateway.cli, "_serve", lambda args: seen.append(args) or 0)
    k8s_args = gateway_container().get("args", [])
    compose_args = compose()["services"]["gateway"].get("command", [])
    for extra in ([], k8s_args, compose_args, ["--workers", "2"]):
        assert gateway.cli.main([*argv[1:], *extra]) == 0
    assert seen[0].command == "serve"
    assert (seen[0].host, seen[0].port) == ("0.0.0.0", exposed_port())


def dockerignored(path: str, patterns: list[str]) -> bool:
    """Whether .dockerignore `patterns` leave `path` out (the subset of the syntax used here:
    `*`, `dir/`, `**/name`, `!exception`; a rule on a directory covers what is inside)."""
    parts = path.split("/")
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    anywhere = ["/".join(parts[j:i]) for i in range(1, len(parts) + 1) for j in range(i)]
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pattern = pattern.removeprefix("!").strip("/")
        if pattern.startswith("**/"):
            hit = any(fnmatch.fnmatchcase(p, pattern[3:]) for p in anywhere)
        else:
            hit = any(fnmatch.fnmatchcase(p, pattern) for p in prefixes)
        if hit:
            ignored = not negate
    return ignored


def test_the_wheel_lists_every_package_of_the_source_tree() -> None:
    """setuptools takes only the packages pyproject lists: a subpackage left out is missing from
    the wheel the image installs, and the gateway fails to import there."""
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    listed = set(project["tool"]["setuptools"]["packages"])
    present = {
        init.parent.relative_to(REPO_ROOT).as_posix().replace("/", ".")
        for top in ("gateway", "policies")
        for init in (REPO_ROOT / top).rglob("__init__.py")
        if "__pycache__" not in init.parts
    }
    assert present == listed


def test_build_context_holds_what_the_wheel_is_built_from() -> None:
    ignore = DOCKERFILE.with_name(DOCKERFILE.name + ".dockerignore")
    patterns = [
        line.strip()
        for line in ignore.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    copied: set[str] = set()
    for copy in dockerfile_stages(DOCKERFILE.read_text())[0].all("COPY"):
        *sources, _ = shlex.split(copy)
        copied |= {s.strip("/").removeprefix("./") for s in sources if not s.startswith("--")}
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    needed = {"pyproject.toml", project["project"]["readme"]}
    needed |= {p.split(".")[0] for p in project["tool"]["setuptools"]["packages"]}
    assert needed <= copied, f"the builder does not COPY {sorted(needed - copied)}"
    for source in copied:
        files = (
            [REPO_ROOT / source]
            if (REPO_ROOT / source).is_file()
            else [f for f in (REPO_ROOT / source).rglob("*.py")]
        )
        assert files, f"COPY {source}: nothing there"
        for file in files:
            relative = file.relative_to(REPO_ROOT).as_posix()
            if "__pycache__" not in relative:
                assert not dockerignored(relative, patterns), (
                    f"{relative} is left out of the context"
                )
    for left_out in ("tests/conftest.py", ".git/HEAD", "gateway/__pycache__/app.cpython-311.pyc"):
        assert dockerignored(left_out, patterns), f"{left_out} would be sent to the builder"


# -- docker compose --------------------------------------------------------------------------


def test_compose_runs_gateway_redis_prometheus_grafana_with_the_gateway_on_8080() -> None:
    services = compose()["services"]
    assert {"gateway", "redis", "prometheus", "grafana"} <= set(services)
    gw = services["gateway"]
    assert container_ports(gw)[0] == exposed_port() == 8080
    assert published(gw["ports"][0]) == ("127.0.0.1", "8080")
    build = gw["build"]
    assert (COMPOSE.parent / build["context"]).resolve() == REPO_ROOT
    assert (REPO_ROOT / build["dockerfile"]).resolve() == DOCKERFILE
    assert "container_name" not in gw, "a fixed container name stops --scale gateway=N"
    redis = services["redis"]
    assert redis["image"].split(":")[0] == "redis"
    assert "redis-cli" in redis["healthcheck"]["test"] and "ping" in redis["healthcheck"]["test"]
    assert gw["depends_on"]["redis"]["condition"] == "service_healthy"


def test_compose_mounts_exist_and_the_gateway_config_is_where_COMPACTGATE_CONFIG_points(
    capsys: pytest.CaptureFixture[str],
) -> None:
    services = compose()["services"]
    for name, service in services.items():
        for target, source in compose_mounts(service).items():
            assert source.exists(), f"{name}: mount of {target} from missing {source}"
            assert DEPLOY in source.parents, f"{name}: mounts {source}, outside deploy/"
    gw = services["gateway"]
    config_file = compose_mounts(gw)[gw["environment"]["COMPACTGATE_CONFIG"]]
    config = load_config(config_file, environ={})
    assert redis_address(config) == ("redis", 6379)
    assert any(m.name == "*" for m in config.models)
    assert gateway.cli.main(["check-config", str(config_file)]) == 0, capsys.readouterr().out
    assert load_config(config_file, environ={"COMPACTGATE_MODE": "observe"}).mode == "observe"


def test_prometheus_scrapes_the_gateway_service_port_and_metrics_path() -> None:
    services = compose()["services"]
    prometheus = services["prometheus"]
    mounts = compose_mounts(prometheus)
    config_path = mounts["/etc/prometheus/prometheus.yml"]
    if any(a.startswith("--config.file=") for a in prometheus.get("command", [])):
        assert "--config.file=/etc/prometheus/prometheus.yml" in prometheus["command"]
    (job,) = yaml_doc(config_path)["scrape_configs"]
    assert job.get("metrics_path", "/metrics") == "/metrics"
    targets = [t for c in job.get("static_configs", []) for t in c["targets"]]
    targets += [f"{n}:{c['port']}" for c in job.get("dns_sd_configs", []) for n in c["names"]]
    # /metrics is served on the admin port, which has no token: Prometheus needs none
    admin_port = compose_gateway_config().server.admin_port
    assert admin_port in container_ports(services["gateway"])
    assert targets == [f"gateway:{admin_port}"]
    assert "authorization" not in job


def test_grafana_is_provisioned_with_the_datasource_and_dashboard_it_mounts() -> None:
    services = compose()["services"]
    grafana = services["grafana"]
    mounts = compose_mounts(grafana)
    assert mounts["/etc/grafana/provisioning"] == DATASOURCES.parent.parent
    (datasource,) = yaml_doc(DATASOURCES)["datasources"]
    url = urlsplit(datasource["url"])
    assert datasource["type"] == "prometheus"
    assert url.hostname == "prometheus" and url.port in container_ports(services["prometheus"])
    (provider,) = yaml_doc(DASHBOARD_PROVIDERS)["providers"]
    assert mounts[provider["options"]["path"]] == DASHBOARD.parent
    env = grafana["environment"]
    home = Path(env["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"])
    assert mounts[str(home.parent)] / home.name == DASHBOARD
    assert env["GF_AUTH_ANONYMOUS_ENABLED"] == "true"
    assert env["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer"


def test_environment_variables_are_read_by_the_gateway_or_its_config(tmp_path: Path) -> None:
    read = env_vars_the_gateway_reads()
    assert {"COMPACTGATE_CONFIG", "COMPACTGATE_UPSTREAM"} <= read  # the scan itself works
    gw = compose()["services"]["gateway"]
    compose_config = compose_mounts(gw)[gw["environment"]["COMPACTGATE_CONFIG"]].read_text()
    k8s_config = configmap_config(tmp_path).read_text()
    stacks = {
        "compose": (set(gw["environment"]), compose_config),
        "k8s": ({e["name"] for e in gateway_container()["env"]}, k8s_config),
    }
    for stack, (names, config_text) in stacks.items():
        referenced = interpolated_vars(config_text)
        unknown = names - read - set(referenced)
        assert not unknown, (
            f"{stack}: {sorted(unknown)} is read by neither the gateway nor its config"
        )
        unset = {n for n, has_default in referenced.items() if not has_default} - names
        assert not unset, f"{stack}: the config needs {sorted(unset)}, which is not set"
        assert "COMPACTGATE_CONFIG" in names


# -- Kubernetes ------------------------------------------------------------------------------


def test_kustomization_lists_every_manifest() -> None:
    resources = yaml_doc(K8S / "kustomization.yaml")["resources"]
    files = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert sorted(resources) == sorted(files)
    expected = {"configmap.yaml", "deployment.yaml", "service.yaml", "hpa.yaml", "redis.yaml"}
    assert expected | {"envoy.yaml", "pdb.yaml"} <= files


def container_port(name: str) -> dict[str, Any]:
    (port,) = [p for p in gateway_container()["ports"] if p["name"] == name]
    return port


def test_deployment_probes_ask_healthz_and_readyz_on_the_container_port() -> None:
    container = gateway_container()
    port = container_port("http")
    assert port["containerPort"] == exposed_port()
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        if probe in container:
            assert container[probe]["httpGet"]["port"] in (port["containerPort"], port.get("name"))
    resources = container["resources"]
    assert resources["requests"]["cpu"] and resources["limits"]["memory"]
    security = container["securityContext"]
    assert security["allowPrivilegeEscalation"] is False
    if security.get("readOnlyRootFilesystem"):
        # prometheus-client's multiprocess files (--workers > 1) go to a temporary directory
        assert "/tmp" in {m["mountPath"] for m in container["volumeMounts"]}


def test_configmap_config_loads_and_points_at_the_redis_sentinels(tmp_path: Path) -> None:
    """The store URL names the sentinel Service, on its sentinel port, and the master set the
    Redis pods' sentinels monitor; that Service selects the Redis StatefulSet's pods, whose
    sentinel container listens there."""
    config = load_config(configmap_config(tmp_path), environ={"REDIS_PASSWORD": "pw"})
    store = parse_store_url(config.store)
    assert store.kind == "sentinel", f"store is {store.masked}: the replicas need Redis Sentinel"
    [(host, port)] = store.hosts
    service = k8s_object("Service", host)
    [sentinel_port] = [p for p in service["spec"]["ports"] if p["port"] == port]
    redis = k8s_object("StatefulSet", "compactgate-redis")
    assert selects(service, redis["spec"]["template"]["metadata"]["labels"])
    containers = {c["name"]: c for c in redis["spec"]["template"]["spec"]["containers"]}
    ports = {p["name"]: p["containerPort"] for c in containers.values() for p in c["ports"]}
    assert ports[sentinel_port["targetPort"]] == port
    assert "--sentinel" in containers["sentinel"]["args"]
    assert all(c["image"].split(":")[0] == "redis" for c in containers.values())
    assert f"SERVICE={store.service}\n" in redis_script()
    assert redis["spec"]["replicas"] >= 3  # a quorum of 2 survives one pod lost
    headless = k8s_object("Service", redis["spec"]["serviceName"])
    assert headless["spec"]["clusterIP"] == "None"
    # configure.sh names the pods as the headless Service makes them
    assert f"$(hostname).{headless['metadata']['name']}" in redis_script()
    assert f"{redis['metadata']['name']}-0.{headless['metadata']['name']}" in redis_script()


def redis_script() -> str:
    return str(k8s_object("ConfigMap", "compactgate-redis-scripts")["data"]["configure.sh"])


def selects(service: dict[str, Any], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in service["spec"]["selector"].items())


def test_clients_reach_envoy_and_envoy_reaches_every_gateway_pod() -> None:
    """Service compactgate (what clients use) selects the Envoy pods on Envoy's listener port;
    the gateway pods are selected only by the headless Service Envoy's cluster resolves, on the
    gateway's proxy port (never the admin port)."""
    deployment = gateway_deployment()
    gateway_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert selects(
        {"spec": {"selector": deployment["spec"]["selector"]["matchLabels"]}}, gateway_labels
    )
    services = [s for s in k8s_objects() if s["kind"] == "Service" and selects(s, gateway_labels)]
    assert [s["metadata"]["name"] for s in services] == ["compactgate-replicas"]
    (headless,) = services
    assert headless["spec"]["clusterIP"] == "None"  # ring hash needs each pod's address
    port = container_port("http")
    for service_port in headless["spec"]["ports"]:
        assert service_port["targetPort"] in (port["containerPort"], port["name"])

    front = k8s_object("Service", "compactgate")
    envoy = k8s_object("Deployment", "compactgate-envoy")
    assert selects(front, envoy["spec"]["template"]["metadata"]["labels"])
    (container,) = envoy["spec"]["template"]["spec"]["containers"]
    (listener_port,) = container["ports"]
    (front_port,) = front["spec"]["ports"]
    assert front_port["targetPort"] in (listener_port["name"], listener_port["containerPort"])
    config = envoy_config()
    (listener,) = config["static_resources"]["listeners"]
    assert listener["address"]["socket_address"]["port_value"] == listener_port["containerPort"]
    (cluster,) = config["static_resources"]["clusters"]
    [[endpoint]] = [e["lb_endpoints"] for e in cluster["load_assignment"]["endpoints"]]
    address = endpoint["endpoint"]["address"]["socket_address"]
    assert address["address"] == headless["metadata"]["name"]
    assert address["port_value"] == headless["spec"]["ports"][0]["port"]
    assert cluster["type"] == "STRICT_DNS" and cluster["lb_policy"] == "RING_HASH"
    (check,) = cluster["health_checks"]
    assert (
        check["http_health_check"]["path"]
        == gateway_container()["readinessProbe"]["httpGet"]["path"]
    )


def envoy_config() -> dict[str, Any]:
    return yaml.safe_load(ENVOY.read_text())


def test_the_envoy_configmap_is_deploy_envoy_yaml_and_runs_the_tested_envoy() -> None:
    configmap = k8s_object("ConfigMap", "compactgate-envoy")
    assert configmap["data"]["envoy.yaml"] == ENVOY.read_text(), (
        "deploy/k8s/envoy.yaml must carry deploy/envoy/envoy.yaml verbatim: copy it there"
    )
    envoy = k8s_object("Deployment", "compactgate-envoy")
    (container,) = envoy["spec"]["template"]["spec"]["containers"]
    path = Path(container["args"][container["args"].index("-c") + 1])
    (mount,) = [m for m in container["volumeMounts"] if Path(m["mountPath"]) == path.parent]
    (volume,) = [
        v for v in envoy["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"]
    ]
    assert volume["configMap"]["name"] == "compactgate-envoy" and path.name == "envoy.yaml"
    binary = shutil.which("envoy")
    if binary is not None:  # the image is the version the suite runs (tests/test_envoy.py)
        version = subprocess.run([binary, "--version"], capture_output=True, text=True, check=True)
        tag = container["image"].rsplit(":v", 1)[1]
        assert f"/{tag}/" in version.stdout


def test_envoy_retries_only_what_cannot_have_reached_a_replica_and_never_times_out_a_stream() -> (
    None
):
    config = envoy_config()
    (listener,) = config["static_resources"]["listeners"]
    (manager,) = listener["filter_chains"][0]["filters"]
    manager = manager["typed_config"]
    assert [u["upgrade_type"] for u in manager["upgrade_configs"]] == ["websocket"]
    routes = [r for h in manager["route_config"]["virtual_hosts"] for r in h["routes"]]
    forwarded = [r for r in routes if "route" in r]
    assert forwarded
    for route in forwarded:
        action = route["route"]
        assert action["timeout"] == "0s"  # Envoy's default (15 s) would cut long streams
        retried = set(action["retry_policy"]["retry_on"].split(","))
        assert retried <= {"connect-failure", "refused-stream", "reset-before-request"}
        headers = [h["header"]["header_name"] for h in action["hash_policy"]]
        assert headers[:3] == ["session-id", "session_id", "x-claude-code-session-id"]
        assert headers[3] == "x-compactgate-conversation"
    admin = [r for r in routes if r["match"].get("prefix") == "/v1/compactgate/"]
    assert admin and "direct_response" in admin[0]


def test_hpa_scales_the_gateway_deployment_on_cpu() -> None:
    (hpa,) = [o for o in k8s_objects() if o["kind"] == "HorizontalPodAutoscaler"]
    assert hpa["apiVersion"] == "autoscaling/v2"
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == (
        "Deployment",
        gateway_deployment()["metadata"]["name"],
    )
    assert hpa["spec"]["minReplicas"] >= 2
    assert hpa["spec"]["maxReplicas"] > hpa["spec"]["minReplicas"]
    (metric,) = hpa["spec"]["metrics"]
    assert (metric["type"], metric["resource"]["name"]) == ("Resource", "cpu")
    assert gateway_container()["resources"]["requests"]["cpu"], "CPU utilisation needs a request"


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_kubectl_kustomize_renders_the_manifests() -> None:
    result = subprocess.run(
        ["kubectl", "kustomize", str(K8S)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    kinds = sorted(doc["kind"] for doc in yaml.safe_load_all(result.stdout) if doc)
    assert kinds == sorted(o["kind"] for o in k8s_objects())


# -- Grafana dashboard, read -----------------------------------------------------------------


def test_dashboard_panels_use_the_provisioned_datasource_and_fit_the_grid() -> None:
    board = dashboard()
    uid = yaml_doc(DATASOURCES)["datasources"][0]["uid"]
    assert board["schemaVersion"] >= 36 and board["uid"]
    panels = list(walk_panels(board["panels"]))
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == uid, panel["title"]
        targets = panel["targets"]
        assert targets, f"{panel['title']}: no query"
        assert len({t["refId"] for t in targets}) == len(targets), panel["title"]
        for target in targets:
            assert target["datasource"]["uid"] == uid, panel["title"]
    for variable in board["templating"]["list"]:
        if variable.get("type") == "query":
            assert variable["datasource"]["uid"] == uid


def test_dashboard_shows_every_metric_operators_need() -> None:
    used = set().union(*(metric_names(q) for q in dashboard_queries()))
    assert REQUIRED_METRICS <= used, f"no panel shows {sorted(REQUIRED_METRICS - used)}"


# -- Grafana dashboard against a real gateway's /metrics -------------------------------------


@dataclass
class Scrape:
    """A real gateway's /metrics after traffic, and what the traffic saw."""

    url: str
    text: str
    compacted_steps: str
    context_retries: str

    def exposed(self) -> set[str]:
        """Sample names PromQL can select, from the `# TYPE` lines.

        In single-process mode prometheus-client writes `# HELP`/`# TYPE` for every registered
        family, also for a labelled one that has no sample yet (no child was ever created):
        the summary cache and summariser families are defined but not incremented until used,
        so a family counts as present when its TYPE line is there. (In multiprocess mode,
        `--workers > 1`, a family without samples is absent altogether, so the fixture runs one
        worker and clears PROMETHEUS_MULTIPROC_DIR.)
        """
        names: set[str] = set()
        for family, kind in re.findall(r"^# TYPE (\S+) (\S+)$", self.text, re.MULTILINE):
            if kind == "counter":
                names.add(family if family.endswith("_total") else family + "_total")
            elif kind == "histogram":
                names |= {family + "_bucket", family + "_sum", family + "_count"}
            elif kind == "summary":
                names |= {family, family + "_sum", family + "_count"}
            else:
                names.add(family)
        return names

    def sample_labels(self) -> dict[str, set[str]]:
        """Sample name -> label names, for samples present (families with traffic)."""
        found: dict[str, set[str]] = {}
        for name, labels in re.findall(
            r"^([A-Za-z_:][\w:]*)(?:\{([^}]*)\})? \S+$", self.text, re.M
        ):
            keys = set(re.findall(r'(\w+)="', labels))
            found.setdefault(name, set()).update(keys)
        return found

    def value(self, name: str, **labels: str) -> float:
        total = 0.0
        for sample, raw, value in re.findall(r"^(\w+)(?:\{([^}]*)\})? (\S+)$", self.text, re.M):
            have = dict(re.findall(r'(\w+)="([^"]*)"', raw))
            if sample == name and all(have.get(k) == v for k, v in labels.items()):
                total += float(value)
        return total


def history(turns: int, words: int) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": "You are terse."}]
    for turn in range(turns):
        text = " ".join(f"word{turn}x{i}" for i in range(words))
        messages += [
            {"role": "user", "content": f"Q{turn}: {text}"},
            {"role": "assistant", "content": f"A{turn}: {text}"},
        ]
    return [*messages, {"role": "user", "content": "And now?"}]


@pytest.fixture(scope="module")
def scrape(
    fake_upstream_server: FakeUpstream, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Scrape]:
    """One `compactgate serve` process for this module (stopped at its end), driven by the
    official openai client: a plain request, one that must be compacted, one the upstream
    refuses with a context error (retried), one for an unknown model."""
    fake = fake_upstream_server
    fake.reset()
    config = {
        "models": [
            {
                "name": "roomy",
                "upstream": {"base_url": fake.base_url},
                "context_window": 100_000,
                "max_output_tokens": 16,
                "tokenizer": "chars:4",
            },
            {
                "name": "small",
                "upstream": {"base_url": fake.base_url},
                "context_window": 600,
                "max_output_tokens": 32,
                "tokenizer": "chars:4",
                "policy": "p",
            },
        ],
        "policies": {"p": {"steps": [{"type": "fifo"}]}},
    }
    path = tmp_path_factory.mktemp("deploy") / "gateway.yaml"
    path.write_text(json.dumps(config))
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    process: RunningProcess = start_process(
        [sys.executable, "-m", "gateway", "serve", "--config", str(path), "--port", "0"],
        r"Uvicorn running on http://127\.0\.0\.1:(\d+)",
        30,
        env=env,
    )
    try:
        assert process.match is not None
        url = f"http://127.0.0.1:{process.match.group(1)}"
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="sk-test", max_retries=0, timeout=30)
        with client:
            client.chat.completions.create(model="roomy", messages=history(1, 3))
            compacted = client.chat.completions.with_raw_response.create(
                model="small", messages=history(30, 20)
            )
            # ~300 of the fake's tokens against its limit of 150: refused, compacted, retried
            fake.script([{"kind": "context_limit", "limit": 150, "style": "openai"}])
            retried = client.chat.completions.with_raw_response.create(
                model="roomy", messages=history(6, 10)
            )
            with pytest.raises(openai.NotFoundError):
                client.chat.completions.create(model="nope", messages=history(0, 0))
        text = httpx.get(f"{url}/metrics", timeout=10).text
        yield Scrape(
            url=url,
            text=text,
            compacted_steps=compacted.headers["x-compactgate-steps"],
            context_retries=retried.headers["x-compactgate-retries"],
        )
    finally:
        process.stop()


def test_traffic_drove_compaction_and_a_context_error_retry(scrape: Scrape) -> None:
    assert "fifo" in scrape.compacted_steps.split(",")
    assert scrape.context_retries == "1"
    assert scrape.value("compactgate_compactions_total", step="fifo") >= 1
    assert scrape.value("compactgate_tokens_saved_total", model="small") > 0
    assert scrape.value("compactgate_context_errors_total") >= 1
    assert scrape.value("compactgate_emergency_retries_total", model="roomy") == 1
    assert scrape.value("compactgate_context_errors_avoided_total", model="roomy") == 1
    assert scrape.value("compactgate_requests_total", status="200") == 3
    assert scrape.value("compactgate_requests_total", status="404") == 1


def test_every_dashboard_metric_is_exposed_by_the_gateway(scrape: Scrape) -> None:
    exposed = scrape.exposed()
    missing = {
        f"{name} (in {query!r})"
        for query in dashboard_queries()
        for name in metric_names(query)
        if name not in exposed
    }
    assert not missing, "the dashboard queries metrics the gateway does not expose:\n" + "\n".join(
        sorted(missing)
    )


def test_dashboard_label_names_exist_on_the_metrics_they_filter(scrape: Scrape) -> None:
    """Checked for queries whose metrics all have samples after the traffic (a family with no
    sample shows no label names in the exposition)."""
    labels = scrape.sample_labels()
    checked = 0
    for query in dashboard_queries():
        names = metric_names(query)
        if not all(name in labels for name in names):
            continue
        known = set().union(*(labels[name] for name in names)) | {"le"}
        unknown = label_names(query) - known
        assert not unknown, f"{query}: no label {sorted(unknown)} on {sorted(names)}"
        checked += 1
    assert checked >= 10


def test_probe_healthcheck_and_scrape_paths_answer_on_the_real_gateway(scrape: Scrape) -> None:
    container = gateway_container()
    probes = {container[p]["httpGet"]["path"] for p in ("livenessProbe", "readinessProbe")}
    (job,) = yaml_doc(DEPLOY / "prometheus.yml")["scrape_configs"]
    for path in probes | {job.get("metrics_path", "/metrics")}:
        assert httpx.get(scrape.url + path, timeout=10).status_code == 200, path
    # The image's HEALTHCHECK command itself, pointed at this process's port.
    port = scrape.url.rsplit(":", 1)[1]
    command = [sys.executable if a in ("python", "python3") else a for a in healthcheck_command()]
    command = [re.sub(r"127\.0\.0\.1:\d+", f"127.0.0.1:{port}", a) for a in command]
    assert subprocess.run(command, timeout=30, check=False).returncode == 0


# -- Grafana dashboard on a healthy gateway ------------------------------------------------------

FALLBACK = re.compile(r"\bor\s+on\s*\(\s*\)\s+(?:label_replace\(\s*)?vector\(0\)")
SELECTOR = re.compile(r"\b(compactgate_[A-Za-z0-9_]+)(?:\{([^{}]*)\})?")


def selected(text: str, name: str, matchers: str) -> bool:
    """Whether a text exposition has a sample for `name{matchers}` (the `=` and `=~` matchers
    the dashboard writes; a `$variable` matches anything, as "All" does)."""
    wanted = re.findall(r'(\w+)\s*(=~|=)\s*"([^"]*)"', matchers or "")
    for sample, raw in re.findall(r"^(\w+)(?:\{([^}]*)\})? \S+$", text, re.M):
        if sample != name:
            continue
        have = dict(re.findall(r'(\w+)="([^"]*)"', raw))
        if all(
            "$" in value
            or (have.get(label) == value if op == "=" else re.fullmatch(value, have.get(label, "")))
            for label, op, value in wanted
        ):
            return True
    return False


def has_series(query: str, text: str) -> bool:
    """Whether a query returns a series against this exposition: every selector in it has a
    sample, or it falls back to `vector(0)` when they have none."""
    if FALLBACK.search(query):
        return True
    return all(selected(text, name, matchers) for name, matchers in SELECTOR.findall(query))


async def test_no_panel_shows_no_data_on_a_healthy_gateway(
    start_app: Any, local_upstream: Any
) -> None:
    """A gateway that answered one request, compacting nothing and meeting no error: every
    panel has a series to draw (a zero, not "No data"), or says in its own words why it has
    none (`noValue`, e.g. a hit rate before any lookup)."""
    gw = await start_app(
        one_model(local_upstream.base_url, context_window=100_000, tokenizer="chars:4")
    )
    reply = await gw.openai().chat.completions.create(model="m", messages=history(1, 3))
    assert reply.choices[0].message.content
    text = (await gw.http.get(f"{gw.url}/metrics")).text
    empty = []
    for panel in walk_panels(dashboard()["panels"]):
        if panel["type"] == "row" or panel["fieldConfig"]["defaults"].get("noValue"):
            continue
        if not any(has_series(target["expr"], text) for target in panel["targets"]):
            empty.append(f"{panel['title']}: {[t['expr'] for t in panel['targets']]}")
    assert not empty, "panels with no data on a healthy gateway:\n" + "\n".join(empty)


# -- secure defaults -----------------------------------------------------------------------------


def test_compose_publishes_every_port_on_this_machine_only() -> None:
    """The gateway holds OPENAI_API_KEY with no gateway keys, and Grafana lets anonymous viewers
    in: published on every interface, anyone on the network could spend or read them."""
    for name, service in compose()["services"].items():
        for port in service.get("ports", []):
            address, _ = published(port)
            assert address == "127.0.0.1", f"{name} publishes {port} beyond this machine"
    comment = COMPOSE.read_text()
    assert "auth.keys" in comment and "hash-key" in comment  # how to open it deliberately


def test_both_stacks_serve_admin_surfaces_on_their_own_port(tmp_path: Path) -> None:
    """Without a token the admin surfaces answer only loopback clients on the proxy port, which
    would refuse Prometheus: both stacks give them the admin port, and scrape that."""
    compose_config = compose_gateway_config()
    k8s_config = load_config(configmap_config(tmp_path), environ={"REDIS_PASSWORD": "pw"})
    for config in (compose_config, k8s_config):
        assert config.server.admin_port is not None and not config.server.admin_token
    admin = container_port("admin")
    assert admin["containerPort"] == k8s_config.server.admin_port
    annotations = gateway_deployment()["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(admin["containerPort"])
    exposed = {
        p["targetPort"] for s in k8s_objects() if s["kind"] == "Service" for p in s["spec"]["ports"]
    }
    assert not exposed & {"admin", admin["containerPort"]}, "a Service exposes the admin port"


def test_the_autoscaler_alone_sets_the_gateway_replica_count() -> None:
    assert "replicas" not in gateway_deployment()["spec"]
    (hpa,) = [o for o in k8s_objects() if o["kind"] == "HorizontalPodAutoscaler"]
    assert hpa["spec"]["scaleTargetRef"]["name"] == gateway_deployment()["metadata"]["name"]


def pod_labels(name: str) -> dict[str, str]:
    """The pod labels of the Deployment or StatefulSet `name`."""
    found = [
        o
        for o in k8s_objects()
        if o["kind"] in ("Deployment", "StatefulSet") and o["metadata"]["name"] == name
    ]
    assert len(found) == 1, f"expected one workload {name!r}, found {len(found)}"
    return dict(found[0]["spec"]["template"]["metadata"]["labels"])


def matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    assert set(selector) <= {"matchLabels"}, f"unexpected selector {selector}"
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def test_disruption_budgets_keep_each_part_serving_through_drains() -> None:
    budgets = [o for o in k8s_objects() if o["kind"] == "PodDisruptionBudget"]
    assert all(b["apiVersion"] == "policy/v1" for b in budgets)
    (hpa,) = [o for o in k8s_objects() if o["kind"] == "HorizontalPodAutoscaler"]
    minimum = {
        "compactgate": hpa["spec"]["minReplicas"],
        "compactgate-redis": k8s_object("StatefulSet", "compactgate-redis")["spec"]["replicas"],
        "compactgate-envoy": k8s_object("Deployment", "compactgate-envoy")["spec"]["replicas"],
    }
    for workload, replicas in minimum.items():
        covering = [b for b in budgets if matches(b["spec"]["selector"], pod_labels(workload))]
        assert len(covering) == 1, f"{workload}: {len(covering)} budgets"
        spec = covering[0]["spec"]
        if "maxUnavailable" in spec:
            assert 1 <= spec["maxUnavailable"] < replicas  # drains go on, some pods stay
        else:
            assert 1 <= spec["minAvailable"] < replicas


def policy_for(labels: dict[str, str]) -> dict[str, Any]:
    found = [
        o
        for o in k8s_objects()
        if o["kind"] == "NetworkPolicy" and matches(o["spec"]["podSelector"], labels)
    ]
    assert len(found) == 1, f"expected one NetworkPolicy for {labels}, found {len(found)}"
    assert found[0]["apiVersion"] == "networking.k8s.io/v1"
    assert "Ingress" in found[0]["spec"]["policyTypes"]
    return found[0]


def rules_for(policy: dict[str, Any], port: Any) -> list[dict[str, Any]]:
    return [
        rule
        for rule in policy["spec"].get("ingress", [])
        if any(p["port"] == port for p in rule.get("ports", []))
    ]


def test_network_policies_clients_to_envoy_to_the_gateway_to_redis() -> None:
    gateway_labels, redis_labels = pod_labels("compactgate"), pod_labels("compactgate-redis")
    envoy_labels = pod_labels("compactgate-envoy")

    envoy_policy = policy_for(envoy_labels)
    (to_front,) = rules_for(envoy_policy, "http")
    assert to_front["from"], "an empty `from` lets everyone in"
    assert any(peer == {"podSelector": {}} for peer in to_front["from"])  # this namespace
    assert len(envoy_policy["spec"]["ingress"]) == 1, "a rule opens some other port"

    gateway_policy = policy_for(gateway_labels)
    (to_proxy,) = rules_for(gateway_policy, "http")
    (peer,) = to_proxy["from"]
    assert set(peer) == {"podSelector"} and matches(peer["podSelector"], envoy_labels)
    assert not matches(peer["podSelector"], gateway_labels)
    (to_admin,) = rules_for(gateway_policy, "admin")
    assert to_admin["from"] and all("namespaceSelector" in p for p in to_admin["from"])
    assert len(gateway_policy["spec"]["ingress"]) == 2, "a rule opens some other port"

    redis_policy = policy_for(redis_labels)
    (rule,) = redis_policy["spec"]["ingress"]
    assert sorted(p["port"] for p in rule["ports"]) == ["redis", "sentinel"]
    assert all(set(peer) == {"podSelector"} for peer in rule["from"]), "this namespace only"
    allowed = [peer["podSelector"] for peer in rule["from"]]
    assert any(matches(s, gateway_labels) for s in allowed)
    assert any(matches(s, redis_labels) for s in allowed)  # replication, sentinels' agreement
    assert not any(matches(s, envoy_labels) for s in allowed)
    assert not any(matches(s, {"app.kubernetes.io/name": "compactgate"}) for s in allowed)


def secret_ref(container: dict[str, Any], name: str) -> tuple[str, str]:
    (entry,) = [e for e in container["env"] if e["name"] == name]
    ref = entry["valueFrom"]["secretKeyRef"]
    assert not ref.get("optional"), f"{name}: an optional secret would start without it"
    return ref["name"], ref["key"]


def test_redis_requires_the_password_the_gateways_store_url_carries(tmp_path: Path) -> None:
    spec = k8s_object("StatefulSet", "compactgate-redis")["spec"]["template"]["spec"]
    (init,) = spec["initContainers"]
    secret = secret_ref(init, "REDIS_PASSWORD")
    script = redis_script()
    for line in ("requirepass", "masterauth", "sentinel auth-pass $SERVICE"):
        assert f'echo "{line} $REDIS_PASSWORD"' in script
    (redis,) = [c for c in spec["containers"] if c["name"] == "redis"]
    assert secret_ref(redis, "REDISCLI_AUTH") == secret  # the redis-cli readiness probe
    assert redis["readinessProbe"]["exec"]["command"][0] == "redis-cli"

    config_text = configmap_config(tmp_path).read_text()
    (store,) = re.findall(r"^\s*store:\s*(\S+)", config_text, re.M)
    (variable,) = re.findall(r"\$\{(\w+)\}", parse_store_url(store).password or "")
    assert secret_ref(gateway_container(), variable) == secret
    config = load_config(configmap_config(tmp_path), environ={variable: "hex0123"})
    assert parse_store_url(config.store).password == "hex0123"
    assert "kubectl create secret generic " + secret[0] in (DEPLOY / "README.md").read_text()


@pytest.mark.slow
def test_the_redis_pods_configure_script_joins_a_real_sentinel_set(
    start_process: Starter, tmp_path: Path
) -> None:
    """configure.sh, run as the init container would, with real `redis-server`s: with no
    sentinel to ask it makes the first pod a master, whose configs run; a pod started later
    asks that pod's sentinel, and its Redis replicates from the master the sentinel names, with
    the password, while its sentinel is told to watch that master."""
    script = tmp_path / "configure.sh"
    script.write_text(redis_script())
    sentinel_port = free_port()

    def configure(name: str, port: int, sentinel: int) -> Path:
        conf = tmp_path / name
        conf.mkdir()
        env = {
            "PATH": os.environ["PATH"], "REDIS_PASSWORD": "hex0123", "SENTINEL": "127.0.0.1",
            "SENTINEL_PORT": str(sentinel), "SELF": "127.0.0.1", "PORT": str(port),
            "CONF": str(conf), "FIRST": "127.0.0.1", "FIRST_PORT": str(master_port),
        }  # fmt: skip
        subprocess.run(["sh", str(script)], env=env, check=True, timeout=30)
        return conf

    master_port, replica_port = free_port(), free_port()
    first = configure("pod-0", master_port, sentinel=free_port())  # nothing answers there yet
    assert "replicaof" not in (first / "redis.conf").read_text()
    start_process(with_config(first / "redis.conf", master_port, tmp_path), READY, 15)
    binary = shutil.which("redis-server")
    assert binary is not None
    start_process(
        [binary, str(first / "sentinel.conf"), "--sentinel", "--port", str(sentinel_port)],
        r"\+monitor master",
        15,
    )

    second = configure("pod-1", replica_port, sentinel=sentinel_port)
    assert f"replicaof 127.0.0.1 {master_port}" in (second / "redis.conf").read_text()
    assert f"monitor mymaster 127.0.0.1 {master_port} 2" in (second / "sentinel.conf").read_text()
    start_process(with_config(second / "redis.conf", replica_port, tmp_path), REPLICA_READY, 15)
    with redis.Redis(port=master_port, password="hex0123") as client:
        client.set("k", "v")
        assert client.wait(1, 5000) == 1
    with redis.Redis(port=replica_port, password="hex0123") as client:
        assert client.get("k") == b"v"


def with_config(conf: Path, port: int, directory: Path) -> list[str]:
    """redis-server reading `conf` (its first argument), on `port`."""
    binary, *options = redis_argv(port, directory)
    return [binary, str(conf), *options]
