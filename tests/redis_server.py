"""Real `redis-server` processes for the tests, on free loopback ports.

    server = start_redis(start_process)      # or start_process_session for a shared one
    server.url                               # redis://127.0.0.1:<port>/0

    sentinels = start_sentinel_set(start, tmp)   # a master, two replicas, three sentinels
    cluster = start_cluster(start, tmp)          # three masters, `redis-cli --cluster create`

The processes are started through the conftest starters, so the fixture that handed them out
stops them at teardown. Persistence is off (`--save ''`, `--appendonly no`): every server starts
empty; a Sentinel's config and a Cluster node's state go to the directory the caller gives.
Tests that need Redis are skipped, with the reason, when `redis-server` is not installed
(`.ci/run` installs it).
"""

from __future__ import annotations

import contextlib
import random
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from tests.conftest import ProcessStartError, RunningProcess, Starter

READY = r"Ready to accept connections"


@dataclass(frozen=True, slots=True)
class RedisServer:
    process: RunningProcess
    port: int

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        self.process.stop()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_redis(start: Starter, port: int | None = None, attempts: int = 3) -> RedisServer:
    """Start redis-server on `port` (default: a free one; retried if another process took it)."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
    for attempt in range(attempts):
        chosen = port if port is not None else free_port()
        argv = [
            binary, "--port", str(chosen), "--bind", "127.0.0.1", "--save", "", "--appendonly",
            "no", "--protected-mode", "yes", "--loglevel", "notice", "--daemonize", "no",
        ]  # fmt: skip
        try:
            return RedisServer(start(argv, READY, 15), chosen)
        except ProcessStartError:
            if port is not None or attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


# -- a Sentinel set and a Cluster, real processes on free ports --------------------------------

SERVICE = "mymaster"
SENTINEL_READY = r"\+monitor master"
REPLICA_READY = r"MASTER <-> REPLICA sync: (Finished with success|Master accepted a Partial)"


def redis_argv(port: int, directory: Path, *extra: str) -> list[str]:
    """redis-server on `port`, no persistence, its files (if any) in a directory of its own
    under `directory` (a replica's sync file, a cluster node's state)."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
    directory = directory / str(port)
    directory.mkdir(exist_ok=True)
    return [
        binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
        "--dir", str(directory), "--loglevel", "notice", "--daemonize", "no", *extra,
    ]  # fmt: skip


@dataclass(slots=True)
class SentinelSet:
    """One master, its replicas and three sentinels watching it as `mymaster`."""

    servers: dict[int, RunningProcess]  # by port: the master and its replicas
    sentinels: dict[int, RunningProcess]
    service: str = SERVICE

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.sentinels)
        return f"redis-sentinel://{hosts}/{self.service}/0"

    def sentinel(self) -> redis.Redis:
        for port, process in self.sentinels.items():
            if process.popen.poll() is None:
                return redis.Redis(port=port, decode_responses=True, socket_timeout=2)
        raise AssertionError("no sentinel left")

    def master_port(self) -> int:
        with self.sentinel() as client:
            _, port = client.sentinel_get_master_addr_by_name(self.service)
        return int(port)

    def failover(self, timeout: float = 30.0) -> int:
        """SENTINEL FAILOVER once every replica has what the master has, and wait until a
        replica has taken over and every sentinel names it; returns the new master's port."""
        self.wait_settled(timeout)  # a sentinel refuses while an earlier failover goes on
        self.wait_replicated()  # nothing written before is lost to the promotion
        old = self.master_port()
        deadline = time.monotonic() + timeout
        while True:
            try:
                with self.sentinel() as client:
                    client.execute_command("SENTINEL", "FAILOVER", self.service)
                break
            except redis.ResponseError as refused:  # NOGOODSLAVE: the replicas' state is not
                assert time.monotonic() < deadline, str(refused)  # fresh yet after a change
                time.sleep(0.2)
        return self.wait_for_new_master(old, timeout)

    def wait_settled(self, timeout: float) -> None:
        """Until no live sentinel is carrying out a failover."""
        deadline = time.monotonic() + timeout
        while True:
            flags = set()
            for port, process in self.sentinels.items():
                if process.popen.poll() is None:
                    with redis.Redis(port=port, decode_responses=True) as client:
                        flags |= set(client.sentinel_master(self.service)["flags"].split(","))
            if "failover_in_progress" not in flags:
                return
            assert time.monotonic() < deadline, f"a failover still in progress after {timeout} s"
            time.sleep(0.1)

    def wait_for_new_master(self, old: int, timeout: float) -> int:
        """Until every live sentinel names the same new master, and it says it is one."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(redis.RedisError):
                named = set()
                for port, process in self.sentinels.items():
                    if process.popen.poll() is None:
                        with redis.Redis(port=port, decode_responses=True) as client:
                            named.add(int(client.sentinel_get_master_addr_by_name(self.service)[1]))
                if len(named) == 1 and old not in named and _role(port := named.pop()) == "master":
                    return port
            time.sleep(0.1)
        raise AssertionError(f"no new master within {timeout} s")

    def wait_replicated(self) -> None:
        """Block until every live server but the master replicates from it, in sync, and has
        applied all the master has (so a failover loses nothing written before)."""
        deadline = time.monotonic() + 20  # a demoted master may still be joining the new one
        while True:
            master = self.master_port()
            live = [p for p, r in self.servers.items() if r.popen.poll() is None and p != master]
            with redis.Redis(port=master, decode_responses=True) as client:
                sent = int(client.info("replication")["master_repl_offset"])
            states = {port: _replica_state(port, master) for port in live}
            if all(state is not None and state >= sent for state in states.values()):
                return
            assert time.monotonic() < deadline, f"replicas behind the master: {states} < {sent}"
            time.sleep(0.05)


def start_sentinel_set(start: Starter, directory: Path, replicas: int = 2) -> SentinelSet:
    """A master, `replicas` replicas and three sentinels (failover after 1 s unanswered); waits
    until every sentinel knows the replicas and the other sentinels."""
    master = free_port()
    servers = {master: start(redis_argv(master, directory), READY, 15)}
    for _ in range(replicas):
        port = free_port()
        argv = redis_argv(port, directory, "--replicaof", "127.0.0.1", str(master))
        servers[port] = start(argv, REPLICA_READY, 15)
    sentinels = {}
    for _ in range(3):
        port = free_port()
        conf = directory / f"sentinel-{port}.conf"
        conf.write_text(
            f"port {port}\nbind 127.0.0.1\ndir {directory}\n"
            f"sentinel monitor {SERVICE} 127.0.0.1 {master} 2\n"
            f"sentinel down-after-milliseconds {SERVICE} 1000\n"
            f"sentinel failover-timeout {SERVICE} 10000\n"
            f"sentinel parallel-syncs {SERVICE} 1\n"
        )
        binary = shutil.which("redis-server")
        assert binary is not None
        sentinels[port] = start([binary, str(conf), "--sentinel"], SENTINEL_READY, 15)
    found = SentinelSet(servers, sentinels)
    deadline = time.monotonic() + 30
    for port in sentinels:
        with redis.Redis(port=port, decode_responses=True) as client:
            while True:
                known = client.sentinel_slaves(SERVICE), client.sentinel_sentinels(SERVICE)
                if len(known[0]) == replicas and len(known[1]) == 2:
                    break
                assert time.monotonic() < deadline, f"sentinel {port} knows only {known}"
                time.sleep(0.1)
    return found


@dataclass(slots=True)
class ClusterSet:
    """A Redis Cluster of masters made with `redis-cli --cluster create`."""

    nodes: dict[int, RunningProcess]

    @property
    def url(self) -> str:
        return "redis-cluster://" + ",".join(f"127.0.0.1:{port}" for port in self.nodes)


def start_cluster(start: Starter, directory: Path, masters: int = 3) -> ClusterSet:
    cli = shutil.which("redis-cli")
    if cli is None:
        pytest.skip("redis-cli is not installed (apt-get install redis-tools)")
    nodes = {}
    for _ in range(masters):
        port = _cluster_port()
        argv = redis_argv(
            port,
            directory,
            "--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{port}.conf",
            "--cluster-node-timeout", "2000",
        )  # fmt: skip
        nodes[port] = start(argv, READY, 15)
    addresses = [f"127.0.0.1:{p}" for p in nodes]
    subprocess.run(
        [cli, "--cluster", "create", *addresses, "--cluster-replicas", "0", "--cluster-yes"],
        check=True,
        capture_output=True,
        timeout=60,
    )
    deadline = time.monotonic() + 30
    for port in nodes:
        with redis.Redis(port=port, decode_responses=True) as client:
            while client.cluster("info")["cluster_state"] != "ok":
                assert time.monotonic() < deadline, f"cluster node {port} never became ok"
                time.sleep(0.1)
    return ClusterSet(nodes)


def _cluster_port() -> int:
    """A free port whose cluster bus port (+10000) is free too."""
    for _ in range(100):
        port = free_port()
        if port + 10000 >= 65536:
            port = random.randint(20000, 30000)
        try:
            for candidate in (port, port + 10000):
                with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                    sock.bind(("127.0.0.1", candidate))
        except OSError:
            continue
        return port
    raise AssertionError("no free port pair for a cluster node")


def _replica_state(port: int, master: int) -> int | None:
    """The offset a replica of `master` has applied; None unless it is one, linked and synced."""
    with redis.Redis(port=port, decode_responses=True, socket_timeout=1) as client:
        info = client.info("replication")
    if (
        info.get("role") != "slave"
        or int(info.get("master_port", 0)) != master
        or info.get("master_link_status") != "up"
        or int(info.get("master_sync_in_progress", 1))
    ):
        return None
    return int(info["slave_repl_offset"])


def _role(port: int) -> str | None:
    with redis.Redis(port=port, decode_responses=True, socket_timeout=1) as client:
        return str(client.role()[0])
