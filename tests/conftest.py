"""Fixtures every test folder shares: private Redis servers and a Redis Cluster."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from _redis_servers import RedisCluster, RedisServer, ServerError, server_binaries
from services import REQUIRED

# -- private Redis servers: started by the tests that stop, kill or cluster them ---------------


def _cannot_start(what: str, reason: str) -> None:
    """Skip the test, or fail it under ZERDA_REQUIRE_SERVICES=1 (CI must not skip it)."""
    message = f"cannot start {what}: {reason}"
    if REQUIRED:
        pytest.fail(f"{message}, and ZERDA_REQUIRE_SERVICES=1", pytrace=False)
    pytest.skip(f"{message} (the tests that stop servers or need a cluster start their own)")


@pytest.fixture
def start_redis(tmp_path: Path) -> Iterator[Callable[..., RedisServer]]:
    """Start private redis-servers (``start_redis(durable=False, extra=())``, see
    :class:`RedisServer`), each in its own folder under ``tmp_path``; every one is killed when
    the test ends, however it ends."""
    started: list[RedisServer] = []

    def start(*, durable: bool = False, extra: Sequence[str] = ()) -> RedisServer:
        server = RedisServer(tmp_path / f"redis-{len(started)}", durable=durable, extra=extra)
        started.append(server)
        try:
            server.start()
        except ServerError as exc:
            _cannot_start("a private redis-server", str(exc))
        return server

    try:
        yield start
    finally:
        for server in started:
            server.kill()


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisCluster]:
    """A 3-primary Redis Cluster on loopback ports, for the whole test session."""
    try:
        server_binaries()
    except ServerError as exc:
        _cannot_start("a Redis Cluster", str(exc))
    cluster = RedisCluster(tmp_path_factory.mktemp("redis-cluster"))
    try:
        cluster.start()
    except ServerError as exc:
        _cannot_start("a Redis Cluster", str(exc))
    try:
        yield cluster
    finally:
        cluster.kill()
