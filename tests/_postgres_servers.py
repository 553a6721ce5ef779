"""Private Postgres servers for the fault tests: initdb and pg_ctl in a folder of their own."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import pytest

import services


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def postgres_binary(name: str) -> str | None:
    """``name`` (initdb, pg_ctl) from PATH, else from the newest /usr/lib/postgresql/*/bin."""
    found = shutil.which(name)
    if found is not None:
        return found

    def version(path: str) -> int:
        major = Path(path).parts[-3]
        return int(major) if major.isdigit() else 0

    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), key=version)
    return candidates[-1] if candidates else None


@dataclass
class Cluster:
    """A private Postgres cluster (initdb + pg_ctl) on a port of its own."""

    root: Path
    port: int
    as_postgres: list[str]
    pg_ctl: str

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _ctl(self, *args: str) -> None:
        subprocess.run(
            [*self.as_postgres, self.pg_ctl, "-D", str(self.data), *args],
            check=True,
            capture_output=True,
            timeout=120,
        )

    def start(self) -> None:
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1"
        self._ctl("-o", options, "-l", str(self.root / "log"), "-w", "-t", "60", "start")

    def stop_hard(self) -> None:
        """Kill every server process at once (no checkpoint); the next start recovers."""
        self._ctl("-m", "immediate", "-w", "stop")

    def running(self) -> bool:
        done = subprocess.run(
            [*self.as_postgres, self.pg_ctl, "-D", str(self.data), "status"],
            capture_output=True,
            timeout=60,
            check=False,
        )
        return done.returncode == 0

    def postmaster_pid(self) -> int:
        """The server's main process (the first line of postmaster.pid)."""
        return int((self.data / "postmaster.pid").read_text().splitlines()[0])

    def all_pids(self) -> list[int]:
        """The postmaster and every process it started (backends, background workers)."""
        main = self.postmaster_pid()
        return [main, *children_of(main)]

    @contextmanager
    def stopped(self, pids: list[int]) -> Iterator[None]:
        """SIGSTOP ``pids`` (frozen: their sockets stay open, nothing answers); SIGCONT them
        when the block ends, whatever happens in it."""
        stopped: list[int] = []
        try:
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGSTOP)
                except ProcessLookupError:
                    continue  # ended since it was listed (a backend whose client left)
                stopped.append(pid)
            assert stopped, f"none of {pids} is running"
            yield
        finally:
            for pid in stopped:
                with suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)


def children_of(pid: int) -> list[int]:
    """The processes whose parent is ``pid``."""
    if not Path("/proc").is_dir():
        found = subprocess.run(
            ["pgrep", "-P", str(pid)], capture_output=True, text=True, timeout=30, check=False
        )
        return [int(child) for child in found.stdout.split()]
    children = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue  # ended meanwhile
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            children.append(int(entry))
    return children


def cluster_unavailable(reason: str) -> NoReturn:
    """Skip the test, or fail it when the services are required."""
    message = f"cannot start a private Postgres cluster: {reason}"
    if services.REQUIRED:
        pytest.fail(f"{message}, and ZERDA_REQUIRE_SERVICES=1", pytrace=False)
    pytest.skip(message)


@contextmanager
def private_cluster() -> Iterator[Cluster]:
    """A running private cluster, stopped and removed at the end even if the test fails.

    initdb and pg_ctl refuse to run as root: as root they run as the postgres user, in a
    folder it owns (pytest's tmp_path is private to root, so a folder of our own under /tmp).
    """
    initdb, pg_ctl = postgres_binary("initdb"), postgres_binary("pg_ctl")
    if initdb is None or pg_ctl is None:
        cluster_unavailable("initdb and pg_ctl are neither on PATH nor in /usr/lib/postgresql")
    assert initdb is not None
    assert pg_ctl is not None
    as_postgres: list[str] = []
    root = Path(tempfile.mkdtemp(prefix="zerda-pg-"))
    try:
        if os.geteuid() == 0:
            try:
                user = pwd.getpwnam("postgres")
            except KeyError:
                cluster_unavailable("running as root, and there is no postgres user")
            runuser = shutil.which("runuser")
            if runuser is None:
                cluster_unavailable("running as root, and runuser is missing")
            os.chown(root, user.pw_uid, user.pw_gid)
            as_postgres = [str(runuser), "-u", "postgres", "--"]
        cluster = Cluster(root, free_port(), as_postgres, pg_ctl)
        try:
            try:
                subprocess.run(
                    [
                        *as_postgres,
                        initdb,
                        "-D",
                        str(cluster.data),
                        "-A",
                        "trust",
                        "-U",
                        "postgres",
                        "--no-sync",
                    ],
                    check=True,
                    capture_output=True,
                    timeout=180,
                )
                cluster.start()
            except (OSError, subprocess.SubprocessError) as exc:
                detail = getattr(exc, "stderr", b"") or b""
                cluster_unavailable(f"{exc} {detail.decode(errors='replace').strip()}")
            yield cluster
        finally:
            if cluster.data.exists() and cluster.running():
                cluster.stop_hard()
    finally:
        shutil.rmtree(root, ignore_errors=True)
