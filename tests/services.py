"""The Redis and Postgres servers the tests talk to, and how a missing one is handled.

``ZERDA_TEST_REDIS_URL`` / ``ZERDA_TEST_POSTGRES_DSN`` name them (defaults: the machine's
servers on 127.0.0.1). When a server does not answer, its tests skip with the reason; under
``ZERDA_REQUIRE_SERVICES=1`` (set by ``.ci/run``) they fail instead, so CI never passes on
skipped server tests.
"""

from __future__ import annotations

import os
import uuid
from functools import cache

import pytest

REDIS_URL = os.environ.get("ZERDA_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
POSTGRES_DSN = os.environ.get(
    "ZERDA_TEST_POSTGRES_DSN", "postgresql://postgres@127.0.0.1:5432/test"
)
REQUIRED = os.environ.get("ZERDA_REQUIRE_SERVICES") == "1"

# One prefix (Redis keys) / schema (Postgres) per test run, so runs never see each other's
# data and a second run right after the first starts clean.
RUN_ID = f"zt{uuid.uuid4().hex[:10]}"


def unavailable(what: str, reason: str) -> None:
    """Skip the test, or fail it when the services are required."""
    message = f"{what} is not reachable ({reason})"
    if REQUIRED:
        pytest.fail(f"{message}, and ZERDA_REQUIRE_SERVICES=1", pytrace=False)
    pytest.skip(f"{message}; start it or set ZERDA_TEST_{what.upper()}_*")


@cache
def redis_problem() -> str | None:
    """Why the test Redis cannot be used, or None when it answers."""
    try:
        import redis
    except ImportError as exc:
        return f"redis-py is not installed: {exc}"
    try:
        client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2, socket_timeout=5)
        client.ping()
        client.close()
    except Exception as exc:
        return f"{REDIS_URL}: {type(exc).__name__}: {exc}"
    return None


@cache
def postgres_problem() -> str | None:
    """Why the test Postgres cannot be used, or None when it answers."""
    try:
        import psycopg
    except ImportError as exc:
        return f"psycopg is not installed: {exc}"
    try:
        with psycopg.connect(POSTGRES_DSN, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except Exception as exc:
        return f"{POSTGRES_DSN}: {type(exc).__name__}: {exc}"
    return None


def require_redis() -> str:
    """The test Redis URL, or skip/fail the test."""
    problem = redis_problem()
    if problem is not None:
        unavailable("Redis", problem)
    return REDIS_URL


def require_postgres() -> str:
    """The test Postgres DSN, or skip/fail the test."""
    problem = postgres_problem()
    if problem is not None:
        unavailable("Postgres", problem)
    return POSTGRES_DSN
