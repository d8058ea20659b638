"""A throwaway Redis server on 127.0.0.1 for the Redis channel layer (scale-out tests)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support.processes import stop
from tests.support.server import free_port

REDIS_SERVER = "redis-server"


def redis_server_binary() -> str:
    """The redis-server binary; fails loudly when missing (scripts/test installs it)."""
    found = shutil.which(REDIS_SERVER) or (
        "/usr/bin/redis-server" if Path("/usr/bin/redis-server").exists() else None
    )
    if found is None:
        raise RuntimeError(
            "redis-server is not installed; the scale-out tests need it "
            "(scripts/test installs it with apt: `apt-get install redis-server`)"
        )
    return found


@contextmanager
def redis_server(port: int | None = None) -> Iterator[str]:
    """Start redis-server on a free loopback port (or `port`, to restart one), without
    persistence; yields its URL."""
    binary = redis_server_binary()
    port = port or free_port()
    workdir = Path(tempfile.mkdtemp(prefix="toolhub-redis-"))
    log = workdir / "redis.log"
    with log.open("wb") as output:
        process = subprocess.Popen(
            [
                binary,
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(workdir),
                "--protected-mode",
                "yes",
            ],
            cwd=workdir,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    try:
        _wait_until_up(port, process, log)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        stop(process)
        shutil.rmtree(workdir, ignore_errors=True)


def _wait_until_up(port: int, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(
                f"redis-server exited with {process.returncode}:\n{log.read_text(errors='replace')}"
            )
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
                sock.sendall(b"PING\r\n")
                if sock.recv(64).startswith(b"+PONG"):
                    return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("redis-server did not answer PING within 15 s")
