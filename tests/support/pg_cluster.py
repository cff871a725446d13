"""A throwaway PostgreSQL cluster of one test's own, which the test may stop and start at will
(the shared server other tests use is never touched). Needs the PostgreSQL server binaries
(``/usr/lib/postgresql/<version>/bin``); as root the cluster belongs to the ``postgres`` user,
since initdb refuses to run as root."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from .ports import free_port


def find_pg_bin() -> Path | None:
    """The newest installed PostgreSQL's bin directory, or None."""
    candidates = [Path(d) for d in glob.glob("/usr/lib/postgresql/*/bin")]
    usable = [d for d in candidates if (d / "initdb").exists() and (d / "pg_ctl").exists()]
    return max(usable, key=lambda d: int(d.parent.name), default=None)


class PgCluster:
    def __init__(self, bin_dir: Path) -> None:
        self.bin = bin_dir
        self.root = Path(tempfile.mkdtemp(prefix="shardq-pg-"))
        self.data = self.root / "data"
        self.port = free_port()
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust", "--no-sync", "-E", "UTF8",
                  "--locale=C")

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, tool: str, *args: str) -> None:
        argv = [str(self.bin / tool), *args]
        if os.geteuid() == 0:
            argv = ["runuser", "-u", "postgres", "--", *argv]
        result = subprocess.run(argv, cwd="/", capture_output=True, text=True, timeout=60)
        if result.returncode != 0:
            raise RuntimeError(f"{tool} failed ({result.returncode}): {result.stdout}{result.stderr}")

    def start(self) -> None:
        # Commits stay synchronous (the dispatcher's durable enqueue relies on them); fsync is off for
        # speed, which only matters if the machine itself crashes.
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.root / "server.log"), "-w", "-t", "60",
                  "-o", options, "start")

    def stop(self, mode: str = "fast") -> None:
        """``fast``: open connections are cut and the server shuts down (committed work kept);
        ``immediate``: a crash, which loses commits made with synchronous_commit off."""
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")

    def destroy(self) -> None:
        try:
            self.stop()
        except RuntimeError:
            pass  # not running
        shutil.rmtree(self.root, ignore_errors=True)
