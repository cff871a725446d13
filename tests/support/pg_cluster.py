"""A throwaway PostgreSQL cluster of a test's own, on a free port, that the test may stop, kill and
restart (the machine's shared server must never be touched that way).

initdb refuses to run as root, so as root the cluster belongs to the ``postgres`` user.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg

from .ports import free_port


def find_pg_bin() -> str | None:
    dirs = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda d: int(d.split("/")[-2]))
    for d in reversed(dirs):
        if os.access(f"{d}/initdb", os.X_OK) and os.access(f"{d}/pg_ctl", os.X_OK):
            return d
    found = shutil.which("pg_ctl")
    return os.path.dirname(found) if found else None


class PgCluster:
    def __init__(self, bin_dir: str | os.PathLike[str] | None = None) -> None:
        bin_dir = bin_dir or find_pg_bin()
        if bin_dir is None:
            raise RuntimeError("no PostgreSQL server binaries (initdb, pg_ctl) on this machine")
        self.bin = str(bin_dir)
        self.root = Path(tempfile.mkdtemp(prefix="shardq-pg-"))
        self.data = self.root / "data"
        self.port = free_port()
        self._as_root = os.geteuid() == 0

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[bytes]:
        argv = list(args)
        if self._as_root:
            argv = ["runuser", "-u", "postgres", "--", *argv]
        return subprocess.run(argv, cwd="/", capture_output=True, check=check, timeout=120)

    def start(self) -> PgCluster:
        if not self.data.exists():
            if self._as_root:
                shutil.chown(self.root, "postgres", "postgres")
            self._run(
                f"{self.bin}/initdb",
                "-D",
                str(self.data),
                "-U",
                "postgres",
                "-A",
                "trust",
                "--no-sync",
                "-E",
                "UTF8",
                "--locale=C",
            )
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run(
            f"{self.bin}/pg_ctl",
            "-D",
            str(self.data),
            "-l",
            str(self.root / "server.log"),
            "-o",
            options,
            "-w",
            "-t",
            "60",
            "start",
        )
        self.wait_ready()
        return self

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                psycopg.connect(self.url, connect_timeout=2).close()
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def stop(self, mode: str = "fast") -> None:
        """``fast``: open connections are cut and the server shuts down (committed work kept);
        ``immediate``: a crash, which loses commits made with synchronous_commit off."""
        self._run(
            f"{self.bin}/pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop", check=False
        )

    def restart(self, mode: str = "fast") -> None:
        self.stop(mode)
        self.start()

    def destroy(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)
