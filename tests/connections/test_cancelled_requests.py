"""Cancellation reaches the tool (issue 44, item 4): a cancel at each step of an
core__http_request call, against a real HTTP server on 127.0.0.1 that sees the connection
close when the call is cancelled, and never a second request.

Steps: waiting for a concurrency slot (before the tool starts), resolving the host name,
waiting for the answer's head, reading a slow body, and after the result. A held call's
cancel is tests/approvals/test_api.py's.
"""

from __future__ import annotations

import queue
import socket
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from django.core import mail
from django.utils import timezone
from rest_framework.test import APIClient

from apps.connections import broker
from apps.invocations import concurrency
from apps.invocations.capabilities import DjangoMailer
from apps.invocations.models import ConcurrencySlot, InvocationRecord
from apps.tools.contracts import ToolCancelled, ToolContext
from apps.tools.models import Tool
from tests.conftest import Agent, allow
from tests.connections import HTTP, make_connection, usable
from tests.support.threads import start_thread

pytestmark = pytest.mark.django_db(transaction=True)

HELD_S = 15  # the longest the server waits for a client that should have gone
# How soon the server must see the connection close after the cancel: well before the
# request's own timeout (10 s, http_request), which would close it anyway.
CUT_S = 5


class SlowServer(ThreadingHTTPServer):
    """Answers /ok at once; on /slow-head it never answers, on /slow-body it sends 10 of
    100 bytes: then it waits for the client to close the connection, and says so."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.reset()

    def reset(self) -> None:
        self.seen: list[str] = []
        self.arrived = threading.Event()
        self.closed = threading.Event()

    @property
    def port(self) -> int:
        return self.server_address[1]


class _Handler(BaseHTTPRequestHandler):
    server: SlowServer

    def do_GET(self) -> None:
        # This test's events: a request of an earlier test, still open, sets its own.
        seen, arrived, closed = self.server.seen, self.server.arrived, self.server.closed
        seen.append(self.path)
        if self.path == "/ok":
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")
            return
        if self.path == "/slow-body":
            self.send_response(200)
            self.send_header("Content-Length", "100")
            self.end_headers()
            self.wfile.write(b"x" * 10)
            self.wfile.flush()
        arrived.set()
        self.connection.settimeout(HELD_S)
        try:
            if self.connection.recv(1) == b"":  # the client shut the connection down
                closed.set()
        except OSError:  # reset: closed as well
            closed.set()

    do_POST = do_GET

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def server() -> Iterator[SlowServer]:
    running = SlowServer()
    thread = threading.Thread(target=running.serve_forever, daemon=True)
    thread.start()
    yield running
    running.shutdown()
    running.server_close()
    thread.join(timeout=5)


@pytest.fixture
def caller(agent: Agent, server: SlowServer) -> Agent:
    allow(agent.tenant, HTTP, name="http")
    server.reset()
    return agent


def connect(agent: Agent, hosts: tuple[str, ...] = ("127.0.0.1",)) -> str:
    connection = make_connection(agent.tenant, name="slow", hosts=hosts, private=True)
    return str(usable(connection, agent.principal).pk)


def call_later(agent: Agent, url: str, run_id: str, **body: Any) -> queue.Queue[Any]:
    """core__http_request from another thread; its answer arrives on the queue."""
    answers: queue.Queue[Any] = queue.Queue()
    connection_id = connect(agent, body.pop("hosts", ("127.0.0.1",)))

    def call() -> None:
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {agent.key}")
        args = {"url": url, **body}
        answers.put(
            client.post(
                "/api/v1/invocations/",
                {"toolId": HTTP, "args": args, "connectionId": connection_id, "runId": run_id},
                format="json",
            )
        )

    start_thread(call)
    return answers


def running_record(run_id: str) -> InvocationRecord:
    end = time.monotonic() + HELD_S
    while time.monotonic() < end:
        record = InvocationRecord.objects.filter(run_id=run_id, status="running").first()
        if record is not None:
            return record
        time.sleep(0.02)
    raise AssertionError("the call never started")


def cancel(agent: Agent, record: InvocationRecord) -> Any:
    return agent.client.post(f"/api/v1/invocations/{record.pk}/cancel/")


def tool_threads_ended() -> None:
    """The tool's thread outlives its cancelled call until its request gives up."""
    end = time.monotonic() + HELD_S
    while concurrency.lingering.of(HTTP):
        assert time.monotonic() < end, "the tool's thread never ended"
        time.sleep(0.02)


def cancelled(answer: Any, run_id: str) -> None:
    body = answer.json()
    assert (body["status"], body["errorCode"], body["ok"]) == ("cancelled", "cancelled", False)
    record = InvocationRecord.objects.get(run_id=run_id)
    assert (record.status, record.error_code) == ("cancelled", "cancelled")


@pytest.mark.parametrize("path", ["/slow-head", "/slow-body"])
def test_a_cancel_while_the_request_is_out_cuts_its_connection(caller, server, path):
    run_id = f"run-cut{path.replace('/', '-')}"
    answers = call_later(caller, f"http://127.0.0.1:{server.port}{path}", run_id)
    assert server.arrived.wait(HELD_S)
    assert cancel(caller, running_record(run_id)).status_code == 200

    assert server.closed.wait(CUT_S), "the upstream connection stayed open"
    cancelled(answers.get(timeout=HELD_S), run_id)
    tool_threads_ended()
    assert server.seen == [path]  # one request, never sent again


def test_a_cancel_while_the_host_name_resolves_opens_no_connection(caller, server, monkeypatch):
    resolving, go = threading.Event(), threading.Event()

    def slow_resolver(host: str, port: int) -> list[str]:
        resolving.set()
        assert go.wait(HELD_S)
        return ["127.0.0.1"]

    monkeypatch.setattr(broker, "resolver", slow_resolver)
    run_id = "run-cut-resolving"
    answers = call_later(
        caller, f"http://slow.example:{server.port}/ok", run_id, hosts=("slow.example",)
    )
    assert resolving.wait(HELD_S)
    assert cancel(caller, running_record(run_id)).status_code == 200
    cancelled(answers.get(timeout=HELD_S), run_id)

    go.set()  # the name resolves after the cancel: no socket may open
    tool_threads_ended()
    assert server.seen == []


def test_a_cancel_while_waiting_for_a_slot_never_starts_the_tool(caller, server, settings):
    settings.TOOLHUB_CONCURRENCY_WAIT_S = HELD_S
    Tool.objects.filter(pk=HTTP).update(max_concurrency=1)
    Tool.objects.get(pk=HTTP).save()  # (a save: the tool's cached row is read again)
    now = timezone.now()
    ConcurrencySlot.objects.create(  # another process's call holds the only slot
        tenant=caller.tenant,
        tool_id=HTTP,
        acquired_at=now,
        ends_by=now + timedelta(seconds=30),
        expires_at=now + timedelta(seconds=90),
    )
    run_id = "run-cut-waiting"
    answers = call_later(caller, f"http://127.0.0.1:{server.port}/ok", run_id)
    assert cancel(caller, running_record(run_id)).status_code == 200

    cancelled(answers.get(timeout=HELD_S), run_id)
    assert "waited for a slot" in InvocationRecord.objects.get(run_id=run_id).safe_message
    assert server.seen == []
    assert ConcurrencySlot.objects.count() == 1  # only the other process's


def test_a_cancel_after_the_result_changes_nothing(caller, server):
    run_id = "run-cut-after"
    answer = call_later(caller, f"http://127.0.0.1:{server.port}/ok", run_id).get(timeout=HELD_S)
    assert answer.json()["ok"] is True, answer.json()
    record = InvocationRecord.objects.get(run_id=run_id)

    assert cancel(caller, record).status_code == 409
    record.refresh_from_db()
    assert (record.status, record.error_code) == ("succeeded", "")
    assert server.seen == ["/ok"]


def test_a_cancelled_call_hands_no_mail_to_the_server():
    ctx = ToolContext("acme", "agent:test", "run", "call", None, deadline=time.monotonic() + 5)
    mailer = DjangoMailer(ctx)
    ctx.cancel()
    with pytest.raises(ToolCancelled):
        mailer.send(["bob@example.com"], "Hello", "Hi")
    assert mail.outbox == []
    assert DjangoMailer(None).send(["bob@example.com"], "Hello", "Hi") == 1


def test_a_callback_registered_after_the_cancel_runs_at_once():
    ctx = ToolContext("acme", "agent:test", "run", "call", None, deadline=time.monotonic() + 5)
    cuts: list[str] = []
    forget = ctx.on_cancel(lambda: cuts.append("before"))
    forget()  # its I/O is over: not called
    ctx.on_cancel(lambda: cuts.append("during"))
    ctx.cancel()
    ctx.cancel()  # once only
    ctx.on_cancel(lambda: cuts.append("after"))
    assert cuts == ["during", "after"]


def test_a_socket_is_cut_even_if_the_cancel_came_while_it_connected():
    """netguard's _Cut: shut down whatever socket the request has when it is cancelled."""
    from apps.connections import netguard

    listener = socket.create_server(("127.0.0.1", 0))
    try:
        cut = netguard._Cut()
        connection = netguard._PinnedHTTP("127.0.0.1", listener.getsockname()[1], "127.0.0.1", 5)
        connection.cut = cut
        cut()  # cancelled before the socket exists
        connection.connect()
        accepted, _ = listener.accept()
        accepted.settimeout(5)
        assert accepted.recv(1) == b""  # shut down at once
        accepted.close()
        connection.close()
        with pytest.raises(netguard.Cancelled):
            cut.watch(connection)
    finally:
        listener.close()
