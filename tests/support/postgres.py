"""A throwaway PostgreSQL server of a test's own, which the test may stop and start
(the suite's database is never restarted). Like scripts/test's: a unix socket only,
durability off, run as the postgres user when the tests run as root."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path


def _bin_dir() -> Path:
    for candidate in [
        os.environ.get("PG_BIN", ""),
        "/usr/lib/postgresql/15/bin",
        *sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True),
    ]:
        if candidate and (Path(candidate) / "pg_ctl").exists():
            return Path(candidate)
    raise RuntimeError("no PostgreSQL server binaries (initdb, pg_ctl); scripts/test installs them")


class Postgres:
    def __init__(self) -> None:
        self.bin = _bin_dir()
        self.dir = Path(tempfile.mkdtemp(prefix="toolhub-pgf-", dir="/tmp"))
        self.dir.chmod(0o755)
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres", "postgres")
        self.url = f"postgresql://postgres@{str(self.dir).replace('/', '%2F')}/toolhub"

    def _run(self, *args: str) -> None:
        command = [str(self.bin / args[0]), *args[1:]]
        if os.geteuid() == 0:
            command = ["runuser", "-u", "postgres", "--", *command]
        subprocess.run(command, cwd=self.dir, check=True, capture_output=True, timeout=60)

    def init(self) -> None:
        # UTF8 whatever the environment's locale (none: initdb would pick SQL_ASCII, which
        # refuses non-ASCII text from a UTF8 client)
        self._run(
            "initdb",
            "-D",
            f"{self.dir}/data",
            "-A",
            "trust",
            "-U",
            "postgres",
            "--no-sync",
            "-E",
            "UTF8",
            "--locale=C",
        )
        self.start()
        self._run("createdb", "-h", str(self.dir), "-U", "postgres", "toolhub")

    def start(self) -> None:
        options = (
            f"-k {self.dir} -c listen_addresses='' -c fsync=off -c synchronous_commit=off "
            "-c full_page_writes=off"
        )
        self._run("pg_ctl", "-D", f"{self.dir}/data", "-o", options, "-w", "-t", "60", "start",
                  "-l", f"{self.dir}/log")  # fmt: skip

    def stop(self) -> None:
        self._run("pg_ctl", "-D", f"{self.dir}/data", "-m", "fast", "-w", "-t", "30", "stop")


@contextmanager
def postgres_server() -> Iterator[Postgres]:
    server = Postgres()
    try:
        server.init()
        yield server
    finally:
        if (server.dir / "data" / "postmaster.pid").exists():
            with suppress(subprocess.CalledProcessError):
                server.stop()
        shutil.rmtree(server.dir, ignore_errors=True)
