"""Liveness and readiness probes for load balancers and orchestrators
(docs/deployment.md#health-checks).

Both are answered in front of Django: without Django's middleware (whose epoch read is a
database query), without the request threads, and while the server drains. Under Daphne
a probe that needs no wait is answered by the HTTP protocol itself, as soon as its
request is parsed (`answer_at_once`, from toolhub/server/daphne_limits.py): no ASGI
application is started, so the answer does not wait for the event loop's later turns,
which a busy process makes long. The rest (the first probe, or one whose checks are
stale) and every other server go through `HealthProbes`, an ASGI layer.

- `/healthz` is liveness: 200 while the process runs, draining included.
- `/readyz` is readiness: whether *this* process can serve, from its own checks of the
  database and the channel layer. Each check runs in a thread of its own, on a
  connection of its own (not the database pool, not the channel layer's connections),
  so the process's load cannot starve it. A probe asks for a new check and answers at
  once from the newest results, which are younger than STALE_S: while probes keep
  coming the checks run every CHECK_EVERY_S (and on each probe); the first probe, or
  the first after IDLE_AFTER_S without one, waits up to STALE_WAIT_S for fresh ones. A
  check that fails (refused, an error) makes its dependency down from its result on; one
  that only takes longer than CHECK_TIMEOUT_S counts as down once the last success is
  older than GRACE_S. While the server drains, `/readyz` is 503 at once.

Before this, `/readyz` checked through the process's own paths (a pooled connection on
a thread, a message through the channel layer, behind the process's stream feeds) and,
under load, took seconds and reported the channel layer down while Redis was fine
(issue 47).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.http import HttpRequest, JsonResponse
from django.http.request import split_domain_port, validate_host

from toolhub.server import draining
from toolhub.server.limits import ASGIApp, Receive, Scope, Send

CHECK_TIMEOUT_S = 1.0  # a check's connect and read timeout
CHECK_EVERY_S = 1.0  # the checks' cadence while probes come
GRACE_S = 3.0  # a check that only timed out keeps the last success this long
STALE_S = 2.0  # a result this old is not answered from: the probe waits for a fresh one
STALE_WAIT_S = 2.5  # up to this long (PostgreSQL's connect timeout is at least 2 s)
IDLE_AFTER_S = 60.0  # no probe for this long: the checks wait for the next one

HEALTHZ, READYZ = "/healthz", "/readyz"


@dataclass(frozen=True)
class Outcome:
    ok: bool
    timed_out: bool  # failed only by taking too long
    at: float  # time.monotonic() when it ended


class Check:
    """One dependency, checked on a thread of its own by `probe()` (which raises
    TimeoutError when the dependency does not answer in time, anything else when it
    refuses or fails). `wanted()` asks for a check now; the thread also checks every
    CHECK_EVERY_S while asked within IDLE_AFTER_S."""

    def __init__(self, name: str, probe: Callable[[], None]) -> None:
        self.name, self.probe = name, probe
        self.last: Outcome | None = None
        self.last_ok_at: float | None = None
        self.running_since: float | None = None
        self.rounds = 0  # checks completed
        self._asked_at = 0.0
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._waiters: list[Callable[[], object]] = []
        self._thread: threading.Thread | None = None
        self._stopped = False

    def wanted(self, on_done: Callable[[], object] | None = None) -> int:
        """Ask for a check; `on_done` is called (on the check's thread) once a check that
        started after now has ended. Answers the rounds completed so far."""
        with self._lock:
            self._asked_at = time.monotonic()
            if on_done is not None:
                self._waiters.append(on_done)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name=f"readyz-{self.name}", daemon=True
                )
                self._thread.start()
            rounds = self.rounds
        self._wake.set()
        return rounds

    def stale(self, now: float) -> bool:
        return self.last is None or now - self.last.at > STALE_S

    def up(self, now: float) -> bool:
        last, since = self.last, self.running_since
        if since is not None and now - since > CHECK_TIMEOUT_S:
            # A check that hangs past its timeout (a read without one) is a timeout.
            last = Outcome(ok=False, timed_out=True, at=now)
        if last is None:
            return False
        if last.ok:
            return True
        return bool(
            last.timed_out and self.last_ok_at is not None and now - self.last_ok_at < GRACE_S
        )

    def stop(self) -> None:
        """End the thread, closing the probe's connection (a test's database is dropped
        after it only once nothing is connected)."""
        self._stopped = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(CHECK_TIMEOUT_S * 3)

    def _run(self) -> None:
        while not self._stopped:
            self._wake.wait(CHECK_EVERY_S)
            self._wake.clear()
            if time.monotonic() - self._asked_at > IDLE_AFTER_S:
                self._wake.wait()  # nobody probes: sleep until someone does
                self._wake.clear()
            if self._stopped:
                break
            with self._lock:
                waiters, self._waiters = self._waiters, []
            self.running_since = time.monotonic()
            try:
                self.probe()
            except TimeoutError:
                outcome = Outcome(ok=False, timed_out=True, at=time.monotonic())
            except Exception:
                outcome = Outcome(ok=False, timed_out=False, at=time.monotonic())
            else:
                outcome = Outcome(ok=True, timed_out=False, at=time.monotonic())
                self.last_ok_at = outcome.at
            self.last, self.running_since = outcome, None
            with self._lock:
                self.rounds += 1
            for done in waiters:
                done()
        if (close := getattr(self.probe, "close", None)) is not None:
            close()


class DatabaseProbe:
    """`SELECT 1` on a connection of the probe's own, kept between checks and opened
    again after a failure: PostgreSQL's outside the pool, SQLite's on the file."""

    def __init__(self) -> None:
        self.connection: Any = None

    def __call__(self) -> None:
        try:
            if self.connection is None:
                self.connection = self._connect()
            cursor = self.connection.cursor()
            try:
                cursor.execute("SELECT 1")
                if cursor.fetchone()[0] != 1:
                    raise RuntimeError("SELECT 1 did not answer 1")
            finally:
                cursor.close()
        except Exception as exc:
            self.close()
            if _is_timeout(exc):
                raise TimeoutError(str(exc)) from exc
            raise

    def _connect(self) -> Any:
        from django.db import connections

        wrapper = connections["default"]
        if wrapper.vendor == "sqlite":
            return sqlite3.connect(wrapper.settings_dict["NAME"], timeout=CHECK_TIMEOUT_S)
        import psycopg

        params = wrapper.get_connection_params()
        for option in ("cursor_factory", "context", "prepare_threshold"):
            params.pop(option, None)
        # libpq waits at least 2 s to connect; a refused connection fails at once.
        return psycopg.connect(
            **params,
            autocommit=True,
            connect_timeout=max(2, int(CHECK_TIMEOUT_S)),
            options=f"-c statement_timeout={int(CHECK_TIMEOUT_S * 1000)}",
        )

    def close(self) -> None:
        connection, self.connection = self.connection, None
        if connection is not None:
            with contextlib.suppress(Exception):  # already broken
                connection.close()


def _is_timeout(exc: BaseException) -> bool:
    text = str(exc).lower()
    return isinstance(exc, TimeoutError) or "timeout" in text or "timed out" in text


class ChannelLayerProbe:
    """`PING` to each Redis server of the channel layer, on a client of the probe's own
    with CHECK_TIMEOUT_S socket timeouts. The in-memory layer lives in the process: up."""

    def __init__(self) -> None:
        self.clients: list[Any] | None = None

    def __call__(self) -> None:
        import redis

        if self.clients is None:
            self.clients = [
                redis.Redis.from_url(
                    address,
                    socket_timeout=CHECK_TIMEOUT_S,
                    socket_connect_timeout=CHECK_TIMEOUT_S,
                    retry_on_timeout=False,
                )
                for address in _redis_addresses()
            ]
        try:
            for client in self.clients:
                if client.ping() is not True:
                    raise RuntimeError("PING did not answer PONG")
        except redis.TimeoutError as exc:
            raise TimeoutError(str(exc)) from exc

    def close(self) -> None:
        clients, self.clients = self.clients or [], None
        for client in clients:
            with contextlib.suppress(Exception):
                client.close()


def _redis_addresses() -> list[str]:
    layer: dict[str, Any] = settings.CHANNEL_LAYERS.get("default", {})
    if "InMemory" in str(layer.get("BACKEND", "")):
        return []
    addresses = []
    for host in layer.get("CONFIG", {}).get("hosts") or ["redis://localhost:6379"]:
        if isinstance(host, dict):
            address = host.get("address") or f"redis://{host['host']}:{host.get('port', 6379)}"
        elif isinstance(host, (tuple, list)):
            address = f"redis://{host[0]}:{host[1]}"
        else:
            address = str(host)
        addresses.append(address)
    return addresses


class Readiness:
    """The process's checks; one per process (`readiness`)."""

    def __init__(self) -> None:
        self.checks = {
            "database": Check("database", DatabaseProbe()),
            "channelLayer": Check("channelLayer", ChannelLayerProbe()),
        }

    async def results(self) -> dict[str, bool]:
        """Ask for new checks; answer from the newest results, on the loop."""
        loop = asyncio.get_running_loop()
        waits = {}
        for check in self.checks.values():
            done: asyncio.Future[None] = loop.create_future()
            check.wanted(functools.partial(loop.call_soon_threadsafe, _resolve, done))
            waits[check] = done
        now = time.monotonic()
        if stale := [done for check, done in waits.items() if check.stale(now)]:
            await asyncio.wait(stale, timeout=STALE_WAIT_S)  # first probe, or after idling
        return self._answer()

    def results_at_once(self) -> dict[str, bool] | None:
        """Ask for new checks and answer from the newest results, or None when they are
        stale (the caller must then wait for fresh ones: `results`)."""
        for check in self.checks.values():
            check.wanted()
        now = time.monotonic()
        if any(check.stale(now) for check in self.checks.values()):
            return None
        return self._answer()

    def results_now(self) -> dict[str, bool]:
        """The same, for a synchronous caller (Django's view)."""
        events = {}
        for check in self.checks.values():
            done = threading.Event()
            check.wanted(done.set)
            events[check] = done
        now = time.monotonic()
        for check, done in events.items():
            if check.stale(now):
                done.wait(STALE_WAIT_S)  # first probe, or after idling
        return self._answer()

    def stop(self) -> None:
        for check in self.checks.values():
            check.stop()

    def _answer(self) -> dict[str, bool]:
        now = time.monotonic()
        return {name: check.up(now) for name, check in self.checks.items()}


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


readiness = Readiness()


def readyz_body(checks: dict[str, bool]) -> tuple[int, dict[str, Any]]:
    if draining.is_stopping():
        return 503, {"status": "draining", "checks": checks}
    ready = all(checks.values())
    return (200 if ready else 503), {"status": "ok" if ready else "unavailable", "checks": checks}


def answer_at_once(method: str, path: str, host: str) -> tuple[int, bytes] | None:
    """A health probe's answer (status, JSON body) when it can be given without waiting:
    None for another request, or for a `/readyz` whose checks are stale (`HealthProbes`
    then waits for fresh ones). `host` is the Host header (or the server's address)."""
    if path not in HealthProbes.PATHS or method not in ("GET", "HEAD"):
        return None
    if not _host_allowed(host):
        return 400, INVALID_HOST
    if path == HEALTHZ:
        return 200, HEALTHY
    checks = {} if draining.is_stopping() else readiness.results_at_once()
    if checks is None:
        return None
    status, body = readyz_body(checks)
    return status, json.dumps(body).encode()


INVALID_HOST = b'{"detail": "Invalid Host header."}'
HEALTHY = b'{"status": "ok"}'


class HealthProbes:
    """`/healthz` and `/readyz` answered in front of `app` (Django), by the drain's leave
    while the server stops (toolhub/server/draining.py)."""

    PATHS = (HEALTHZ, READYZ)

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path")
        if path not in (HEALTHZ, READYZ) or scope.get("method") not in ("GET", "HEAD"):
            await self.app(scope, receive, send)
            return
        if not _allowed_host(scope):
            await _answer(send, 400, INVALID_HOST)
            return
        if path == HEALTHZ:
            await _answer(send, 200, HEALTHY)
            return
        status, body = readyz_body({} if draining.is_stopping() else await readiness.results())
        await _answer(send, status, json.dumps(body).encode())


async def _answer(send: Send, status: int, body: bytes) -> None:
    """A whole JSON answer; the connection stays open for the prober's next probe."""
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _allowed_host(scope: Scope) -> bool:
    """Django's host check (ALLOWED_HOSTS), as every other path gets it."""
    host = ""
    for name, value in scope.get("headers") or ():
        if name == b"host":
            host = value.decode("latin-1")
            break
    if not host:
        server = scope.get("server")
        host = server[0] if server else ""
    return _host_allowed(host)


def _host_allowed(host: str) -> bool:
    domain, _ = split_domain_port(host)
    allowed = list(settings.ALLOWED_HOSTS)
    if settings.DEBUG and not allowed:
        allowed = [".localhost", "127.0.0.1", "[::1]"]
    return bool(domain) and validate_host(domain, allowed)


def healthz(request: HttpRequest) -> JsonResponse:
    """The process is up; nothing else is checked (also served in front of Django)."""
    return JsonResponse({"status": "ok"})


def readyz(request: HttpRequest) -> JsonResponse:
    """Django's route to the same answer, for servers without `HealthProbes` in front."""
    status, body = readyz_body(readiness.results_now())
    return JsonResponse(body, status=status)
