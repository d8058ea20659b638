"""A real Daphne process serving toolhub against the test database."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from email.message import Message
from pathlib import Path
from typing import Any
from urllib.parse import quote

from django.db import connection

from tests.support.processes import stop

ROOT = Path(__file__).resolve().parents[2]


def database_url() -> str:
    """A DATABASE_URL for the database the tests are using right now."""
    db: dict[str, Any] = connection.settings_dict
    if db["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{db['NAME']}"
    user = quote(db.get("USER") or "", safe="")
    password = f":{quote(db['PASSWORD'], safe='')}" if db.get("PASSWORD") else ""
    host = db.get("HOST") or ""
    port = f":{db['PORT']}" if db.get("PORT") else ""
    if host.startswith("/"):
        return f"postgresql://{user}{password}@{port}/{db['NAME']}?host={quote(host, safe='')}"
    return f"postgresql://{user}{password}@{host}{port}/{db['NAME']}"


class Server(str):
    """The base URL (a str, as before) plus the process: .process, .pid, .port and .log
    (its output)."""

    process: subprocess.Popen[bytes]
    pid: int
    port: int
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# The keepalive toolhub's documented server command uses (scripts/run, docs/deployment.md):
# a client that stops answering pings is dropped within ~15 s.
RECOMMENDED_ARGS = ("--ping-interval", "5", "--ping-timeout", "10")


@contextmanager
def daphne(
    extra_env: dict[str, str] | None = None, args: tuple[str, ...] = RECOMMENDED_ARGS
) -> Iterator[Server]:
    """Start Daphne on a free port; yields its base URL and stops it afterwards.

    `args` go to the daphne command line (e.g. "--ping-interval", "2"). Its output goes
    to a file, not a pipe: nobody reads a pipe, and a chatty server would block on it.
    """
    port = free_port()
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "TOOLHUB_EXTRA_TOOL_MODULES": "tests.support.tools",
        "TOOLHUB_ALLOWED_HOSTS": "127.0.0.1,localhost",
        "TOOLHUB_SECRET_KEY": os.environ.get("TOOLHUB_SECRET_KEY") or "x" * 50,
        # Each output line reaches the file as it is written: tests read Daphne's access
        # lines (stdout, block-buffered into a file otherwise: seconds late under load).
        "PYTHONUNBUFFERED": "1",
        **(extra_env or {}),
    }
    daphne_bin = Path(sys.executable).with_name("daphne")
    fd, name = tempfile.mkstemp(prefix="daphne-", suffix=".log")
    os.close(fd)
    log = Path(name)
    with log.open("wb") as output:
        process = subprocess.Popen(
            [
                str(daphne_bin),
                "-b",
                "127.0.0.1",
                "-p",
                str(port),
                *args,
                "toolhub.asgi:application",
            ],
            cwd=ROOT,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    server = Server(f"http://127.0.0.1:{port}")
    server.process, server.pid, server.port, server.log = process, process.pid, port, log
    try:
        _wait_until_up(server, process)
        yield server
    finally:
        stop(process)
        log.unlink(missing_ok=True)


def _wait_until_up(base: Server, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"daphne exited with {process.returncode}:\n{base.output()}")
        try:
            with urllib.request.urlopen(f"{base}/healthz", timeout=1) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError("daphne did not come up within 30 s")


def invoke(
    base: str, key: str, body: dict[str, Any], timeout: float = 60
) -> tuple[int, Any, Message]:
    """POST /api/v1/invocations/ to a server: its status, JSON body and headers, whether
    it succeeded or answered an error."""
    request = urllib.request.Request(
        f"{base}/api/v1/invocations/",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read()), response.headers
    except urllib.error.HTTPError as refused:
        return refused.code, json.loads(refused.read()), refused.headers
