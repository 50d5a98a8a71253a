"""`store:` URLs (gateway/store/urls.py): every kind parses into its parts, a bad one fails
start-up naming the part, and passwords never show where the URL is printed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.config import ConfigError, load_config
from gateway.store import mask_store_url, parse_store_url


def test_every_kind_parses() -> None:
    plain = parse_store_url("redis://:pw@redis.internal:6380/2")
    assert (plain.kind, plain.hosts, plain.password, plain.db, plain.tls) == (
        "redis",
        (("redis.internal", 6380),),
        "pw",
        2,
        False,
    )
    sentinel = parse_store_url("redis-sentinel://:s%40cret@a:26379,b,[::1]:26380/mymaster/3")
    assert sentinel.kind == "sentinel"
    assert sentinel.hosts == (("a", 26379), ("b", 26379), ("::1", 26380))
    assert (sentinel.service, sentinel.db, sentinel.password) == ("mymaster", 3, "s@cret")
    cluster = parse_store_url("rediss-cluster://user:pw@n1:7000,n2:7001?ssl_ca_certs=/ca.pem")
    assert (cluster.kind, cluster.tls, cluster.username, cluster.password) == (
        "cluster",
        True,
        "user",
        "pw",
    )
    assert cluster.hosts == (("n1", 7000), ("n2", 7001))
    assert cluster.options == {"ssl_ca_certs": "/ca.pem"}
    assert parse_store_url("rediss-sentinel://h/s").tls
    memory = parse_store_url("memory://?max_bytes=4096")
    assert (memory.kind, memory.max_bytes, memory.shared) == ("memory", 4096, False)
    assert all(parse_store_url(u).shared for u in ("redis://h", "redis-cluster://h"))


@pytest.mark.parametrize(
    ("url", "named"),
    [
        ("redis-sentinel://h:26379", "master set's name"),
        ("redis-sentinel://h:26379/m/1/2", "nothing more"),
        ("redis-cluster://h:7000/1", "only database 0"),
        ("redis-cluster://h:7000?bogus=1", "unknown option 'bogus'"),
        ("redis-sentinel://h:notaport/m", "bad port"),
        ("redis://a:1,b:2/0", "several hosts"),
        ("redis-cluster://", "no host"),
        ("redis-sentinel://h/m/x", "must be a number"),
        ("redis-cluster://h?socket_timeout=-1", "positive"),
        ("mysql://h", "must be memory://"),
        ("memory://?max_bytes=0", "max_bytes"),
    ],
)
def test_a_bad_url_is_refused_naming_the_part(url: str, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        parse_store_url(url)


def test_a_bad_url_fails_start_up_at_its_yaml_path(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text('store: "redis-sentinel://h:26379"\n')
    with pytest.raises(ConfigError, match=r"store.*master set's name"):
        load_config(path)


@given(password=st.text(alphabet=st.characters(blacklist_categories=["Cs"]), min_size=4))
def test_a_password_never_survives_masking(password: str) -> None:
    from urllib.parse import quote

    for template in (
        "redis://:{}@h:6379/0",
        "redis-sentinel://:{}@a:1,b:2/m/0",
        "rediss-cluster://u:{}@a:1,b:2",
        "redis-sentinel://a:1/m?sentinel_password={}",
    ):
        url = template.format(quote(password, safe=""))
        # the password's place holds *** and nothing else changed (a password that is part of
        # the scheme's name, "redi", is still in "redis://": searching for it proved nothing)
        assert mask_store_url(url) == template.format("***")


def test_check_config_prints_sentinel_and_cluster_urls_masked(tmp_path: Path) -> None:
    for store in (
        "redis-sentinel://:sentinel-pass-secret@s1:26379,s2:26379/mymaster/0"
        "?sentinel_password=watchers-secret",
        "rediss-cluster://:cluster-pass-secret@n1:7000,n2:7001",
    ):
        path = tmp_path / "c.yaml"
        path.write_text(f'store: "{store}"\n')
        result = subprocess.run(
            [sys.executable, "-m", "gateway", "check-config", str(path)],
            capture_output=True,
            text=True,
            check=True,
        )
        assert "secret" not in result.stdout + result.stderr
        assert ":***@" in result.stdout
