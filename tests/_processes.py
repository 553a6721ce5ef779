"""Spawned worker processes for the concurrency tests."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Sequence
from typing import Any


def run_processes(
    target: Callable[..., None], args: Sequence[tuple[Any, ...]], timeout: float = 300
) -> None:
    """Run ``target(*a, barrier)`` for each ``a`` in ``args``, each in a process of its own,
    all sharing one barrier so that they start together. The processes fork from a forkserver
    (a clean process: no locks or connections of this one) that has the test imports loaded
    once, instead of each starting an interpreter and importing them again. Every process must
    exit with status 0; any still running after ``timeout`` is killed."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(
        ["pytest", "hypothesis", "zerda.memory", "zerda.stores", "redis", "psycopg", "psycopg_pool"]
    )
    barrier = ctx.Barrier(len(args))
    procs = [ctx.Process(target=target, args=(*a, barrier)) for a in args]
    try:
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=timeout)
        assert [p.exitcode for p in procs] == [0] * len(procs)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
