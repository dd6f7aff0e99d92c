"""A real PostgreSQL server for the tests: a throwaway cluster on 127.0.0.1 and a free port.

Debian's server binaries (`apt-get install postgresql`, done by ./dev test) refuse to run as
root, so when the tests run as root the cluster is created and run as the `postgres` user.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid


def _bin(name: str) -> str | None:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return found[-1] if found else shutil.which(name)


def available() -> str | None:
    """None when a server can be started here, else the reason."""
    if not _bin("initdb") or not _bin("pg_ctl"):
        return "PostgreSQL server binaries missing: apt-get install postgresql"
    if os.geteuid() == 0:
        try:
            import pwd

            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root but there is no 'postgres' user to run the server"
    return None


class PgServer:
    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="synthwatch-pg-")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.data = os.path.join(self.dir, "data")
        self.as_user: list[str] = []
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres", "postgres")
            self.as_user = ["runuser", "-u", "postgres", "--"]

    def _run(self, *args: str) -> None:
        subprocess.run([*self.as_user, *args], check=True, capture_output=True, timeout=120)

    def start(self) -> PgServer:
        self._run(_bin("initdb") or "initdb", "-D", self.data, "-U", "postgres", "--auth=trust", "-E", "UTF8",
                  "--no-sync")
        opts = (f"-c listen_addresses=127.0.0.1 -c port={self.port} -c unix_socket_directories={self.dir} "
                "-c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200")
        self._run(_bin("pg_ctl") or "pg_ctl", "-D", self.data, "-o", opts, "-l", os.path.join(self.dir, "log"),
                  "-w", "-t", "60", "start")
        return self

    def stop(self) -> None:
        try:
            self._run(_bin("pg_ctl") or "pg_ctl", "-D", self.data, "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)

    def new_database(self) -> str:
        """A fresh database for one test; returns its URL."""
        name = "t_" + uuid.uuid4().hex[:12]
        import psycopg

        with psycopg.connect(f"postgresql://postgres@127.0.0.1:{self.port}/postgres", autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return f"postgresql://postgres@127.0.0.1:{self.port}/{name}"

    def wait(self, timeout_s: float = 30) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.1)
        raise RuntimeError("PostgreSQL did not start")
