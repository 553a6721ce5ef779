"""Private redis-server processes for tests: one server, or a 3-primary Redis Cluster.

The tests that stop, kill or freeze a server, or that need a cluster, start their own on free
loopback ports in a temporary folder, never touching the machine's shared Redis. Every process
started here is killed when its owner closes it, and, on Linux, by the kernel when the process
that started it dies (so a crashed test run leaves no server behind).
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "RedisCluster",
    "RedisServer",
    "ServerError",
    "drop_keys",
    "free_port",
    "fresh_prefix",
    "server_binaries",
]

_READY = "Ready to accept connections"


class ServerError(RuntimeError):
    """A private server could not be found or started (the reason is the message)."""


def server_binaries() -> tuple[str, str]:
    """The paths of redis-server and redis-cli, or :class:`ServerError` saying which is missing."""
    server, cli = shutil.which("redis-server"), shutil.which("redis-cli")
    if server is None or cli is None:
        missing = [
            name for name, path in (("redis-server", server), ("redis-cli", cli)) if not path
        ]
        raise ServerError(f"{' and '.join(missing)} not on PATH")
    return server, cli


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port(*, bus: bool = False) -> int:
    """A loopback port nothing listens on; with ``bus``, one whose cluster bus port (port +
    10000) is free too (so it is picked below the ephemeral range, not by the OS)."""
    if not bus:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port: int = s.getsockname()[1]
        return port
    for _ in range(200):
        port = random.randrange(20_000, 30_000)
        if _bindable(port) and _bindable(port + 10_000):
            return port
    raise ServerError("no free pair of loopback ports (port, port + 10000) found")


def _die_with_parent() -> None:  # pragma: no cover - runs in the child, between fork and exec
    """Ask Linux to SIGKILL this process when the process that started it dies."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class RedisServer:
    """One redis-server of our own on 127.0.0.1:``port``, its files in ``folder``.

    ``durable``: an append-only file fsynced on every write (a SIGKILL keeps every
    acknowledged write); otherwise nothing is saved. ``extra`` are more ``--option value``
    arguments. :meth:`start` again after :meth:`kill` restarts it on the same port and folder.
    """

    def __init__(
        self,
        folder: Path,
        *,
        port: int | None = None,
        durable: bool = False,
        extra: Sequence[str] = (),
    ) -> None:
        self.folder = folder
        self.port = free_port() if port is None else port
        self.durable = durable
        self.extra = list(extra)
        self.process: subprocess.Popen[str] | None = None
        self.log: list[str] = []

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, wait: float = 30) -> None:
        """Start the server and wait until it accepts connections (:class:`ServerError` if
        it does not within ``wait`` seconds)."""
        binary, _ = server_binaries()
        self.folder.mkdir(parents=True, exist_ok=True)
        persistence = (
            ["--appendonly", "yes", "--appendfsync", "always"]
            if self.durable
            else ["--appendonly", "no"]
        )
        command = [
            binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.folder),
            "--save",
            "",
            *persistence,
            "--daemonize",
            "no",
            "--logfile",
            "",
            *self.extra,
        ]
        self.log = []
        self.process = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=self.folder,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )
        ready = threading.Event()

        def read(out: object) -> None:
            # Reads the log to its end, so that the server never blocks on a full pipe.
            for line in out:  # type: ignore[attr-defined]
                self.log.append(line)
                if _READY in line:
                    ready.set()
            ready.set()  # the server ended: stop waiting

        threading.Thread(target=read, args=(self.process.stdout,), daemon=True).start()
        if not ready.wait(wait) or self.process.poll() is not None:
            self.kill()
            raise ServerError(
                f"redis-server on port {self.port} did not start:\n{''.join(self.log)[-2000:]}"
            )

    def stop(self) -> None:
        """SIGSTOP: the server keeps its sockets open and answers nothing."""
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def cont(self) -> None:
        """SIGCONT: the stopped server goes on."""
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL (a stopped server too), and wait for the process to end."""
        process, self.process = self.process, None
        if process is None:
            return
        if process.poll() is None:
            process.send_signal(signal.SIGKILL)
        process.wait(30)
        if process.stdout is not None:
            process.stdout.close()

    def __enter__(self) -> RedisServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.kill()


class RedisCluster:
    """A Redis Cluster of ``primaries`` redis-servers without replicas, on loopback.

    :meth:`start` starts the servers with ``--cluster-enabled yes``, joins them with
    ``redis-cli --cluster create`` and waits until every node says ``cluster_state:ok``;
    :meth:`kill` kills them all. Raises :class:`ServerError` if any step fails.
    """

    def __init__(self, folder: Path, primaries: int = 3) -> None:
        self.folder = folder
        self.nodes: list[RedisServer] = []
        self._admin: Any = None
        ports: set[int] = set()
        while len(ports) < primaries:
            ports.add(free_port(bus=True))
        for port in sorted(ports):
            self.nodes.append(
                RedisServer(
                    folder / str(port),
                    port=port,
                    extra=[
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        f"nodes-{port}.conf",
                        "--cluster-node-timeout",
                        "5000",
                    ],
                )
            )

    @property
    def url(self) -> str:
        """A seed node's URL, as ``open_store`` takes it for a cluster."""
        return f"redis+cluster://127.0.0.1:{self.nodes[0].port}"

    @property
    def ports(self) -> list[int]:
        return [node.port for node in self.nodes]

    def admin(self) -> Any:
        """A ``redis.cluster.RedisCluster`` client of the cluster, made once (finding the
        cluster's slots costs round trips to every node) and closed by :meth:`kill`."""
        if self._admin is None:
            import redis.cluster

            self._admin = redis.cluster.RedisCluster(host="127.0.0.1", port=self.ports[0])
        return self._admin

    def start(self, wait: float = 60) -> None:
        _, cli = server_binaries()
        try:
            for node in self.nodes:
                node.start()
            addresses = [f"127.0.0.1:{port}" for port in self.ports]
            create = subprocess.run(
                [
                    cli,
                    "--cluster",
                    "create",
                    *addresses,
                    "--cluster-replicas",
                    "0",
                    "--cluster-yes",
                ],
                capture_output=True,
                text=True,
                timeout=wait,
                check=False,
            )
            if create.returncode != 0:
                raise ServerError(
                    f"redis-cli --cluster create failed:\n{create.stdout}{create.stderr}"
                )
            self._wait_until_ok(cli, wait)
        except BaseException:
            self.kill()
            raise

    def _wait_until_ok(self, cli: str, wait: float) -> None:
        """Poll CLUSTER INFO on every node until each says ``cluster_state:ok``: the nodes
        agree on the slots only once their gossip has gone round."""
        deadline = time.monotonic() + wait
        pending = list(self.ports)
        while pending:
            port = pending[0]
            info = subprocess.run(
                [cli, "-p", str(port), "cluster", "info"],
                capture_output=True,
                text=True,
                timeout=10,
                check=False,
            )
            if "cluster_state:ok" in info.stdout:
                pending.pop(0)
                continue
            if time.monotonic() > deadline:
                raise ServerError(f"node {port} is not cluster_state:ok:\n{info.stdout}")
            time.sleep(0.05)  # readiness polling of a server starting up, not a test's wait

    def kill(self) -> None:
        admin, self._admin = self._admin, None
        if admin is not None:
            admin.close()
        for node in self.nodes:
            node.kill()

    def __enter__(self) -> RedisCluster:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.kill()


# -- a test's keys: under a prefix of its own, deleted at its end --------------------------------

_prefixes = itertools.count()


def fresh_prefix() -> str:
    """A key prefix no other test (of this run or any other) uses."""
    from services import RUN_ID

    return f"{RUN_ID}-{uuid.uuid4().hex[:8]}.{next(_prefixes)}"


def drop_keys(client: Any, prefix: str) -> None:
    """Delete every key under ``prefix`` (the test's own; never anyone else's), through a
    ``redis.Redis`` or, on every primary, a ``redis.cluster.RedisCluster``."""
    keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
    for start in range(0, len(keys), 500):  # one command a batch (a cluster splits it by slot)
        client.delete(*keys[start : start + 500])
