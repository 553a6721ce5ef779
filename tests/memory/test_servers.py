"""The memory contract over the server stores: Redis, Redis Cluster and Postgres, sync and async.

Each test gets a key prefix or a schema of its own, dropped when it ends.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest

from _redis_servers import RedisCluster, drop_keys, fresh_prefix
from memory.contract import AsyncMemoryContract, MemoryContract, Recipe
from services import RUN_ID, require_postgres, require_redis

_schemas = itertools.count()


class _Redis:
    """A prefix of its own on the machine's Redis (or, with ``cluster``, on the test cluster)."""

    cluster: ClassVar[bool] = False
    supports_processes = True
    store_class: ClassVar[str] = "RedisStore"

    @pytest.fixture(autouse=True)
    def _redis_env(self, request: pytest.FixtureRequest) -> Iterator[None]:
        import redis
        import redis.cluster

        if self.cluster:
            cluster: RedisCluster = request.getfixturevalue("redis_cluster")
            self.url = cluster.url
            self.prefix = fresh_prefix()
            yield
            drop_keys(cluster.admin(), self.prefix)
            return
        self.url = require_redis()
        admin = redis.Redis.from_url(self.url)
        self.prefix = fresh_prefix()
        yield
        try:
            drop_keys(admin, self.prefix)
        finally:
            admin.close()

    def make_store(self) -> Any:
        import zerda.stores

        return getattr(zerda.stores, self.store_class)(self.url, prefix=self.prefix)

    def store_recipe(self) -> Recipe:
        return f"zerda.stores:{self.store_class}", {"url": self.url, "prefix": self.prefix}


class TestRedis(_Redis, MemoryContract):
    pass


class TestRedisAsync(_Redis, AsyncMemoryContract):
    store_class = "AsyncRedisStore"


class TestRedisCluster(_Redis, MemoryContract):
    cluster = True


class TestRedisClusterAsync(_Redis, AsyncMemoryContract):
    cluster = True
    store_class = "AsyncRedisStore"


class _Postgres:
    """A schema of its own on the machine's Postgres."""

    supports_processes = True
    store_class: ClassVar[str] = "PostgresStore"

    @pytest.fixture(autouse=True)
    def _postgres_env(self) -> Iterator[None]:
        import psycopg

        self.dsn = require_postgres()
        self.schema = f"{RUN_ID}_mem{next(_schemas)}"
        yield
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE')

    def make_store(self) -> Any:
        import zerda.stores

        return getattr(zerda.stores, self.store_class)(self.dsn, schema=self.schema, max_size=4)

    def store_recipe(self) -> Recipe:
        options = {"dsn": self.dsn, "schema": self.schema, "max_size": 2}
        return f"zerda.stores:{self.store_class}", options


class TestPostgres(_Postgres, MemoryContract):
    pass


class TestPostgresAsync(_Postgres, AsyncMemoryContract):
    store_class = "AsyncPostgresStore"
