"""The run stream /ws/v1/runs/{runId}/ against a real Daphne process.

Calls are made through Daphne's HTTP API so that their events reach Daphne's
channel layer, exactly as an agent's would.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, suppress
from datetime import datetime, timedelta

import pytest
from django.contrib.auth.models import User
from django.utils import timezone
from websockets.exceptions import ConnectionClosed

from apps.invocations.models import StreamTicket
from tests.conftest import allow, make_agent
from tests.streams.conftest import (
    QUIET,
    KeyClient,
    events,
    logged_in,
    nothing_arrives,
    open_ws,
    operator,
    refusal,
)
from tests.support.server import RECOMMENDED_ARGS, daphne

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.server]

ISO_Z = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$")


def bearer(agent) -> dict[str, str]:
    return {"Authorization": f"Bearer {agent.key}"}


def echo(client: KeyClient, run_id: str, n: int) -> list[str]:
    """n calls of test__echo in the run, one after another; their toolCallIds."""
    ids = []
    for i in range(n):
        body = client.invoke(
            "test__echo",
            args={"text": f"hello {i}", "secret_note": "hunter2"},
            runId=run_id,
            toolCallId=f"{run_id}-call-{i}-{time.monotonic_ns()}",
        )
        assert body["ok"] is True, (body.get("errorCode"), body.get("safeMessage"))
        ids.append(body["toolCallId"])
    return ids


def seqs(received: list[dict]) -> list[int]:
    return [event["seq"] for event in received]


# ---------------------------------------------------------------- live events


def test_a_key_on_the_handshake_receives_start_then_result_of_a_later_call(server, acme):
    client = KeyClient(server, acme.key)
    with open_ws(server, "/ws/v1/runs/run-live/", bearer(acme)) as ws:
        nothing_arrives(ws, 0.3)  # an empty run replays nothing
        body = client.invoke(
            "test__echo",
            args={"text": "hi there", "secret_note": "hunter2"},
            runId="run-live",
            toolCallId="toolu_live_1",
        )
        start, result = events(ws, 2)
        nothing_arrives(ws)

    assert [start["type"], result["type"]] == ["tool_call_start", "tool_call_result"]
    for event in (start, result):
        assert event["v"] == 1
        assert event["runId"] == "run-live"
        assert event["toolCallId"] == "toolu_live_1"
        assert event["toolId"] == "test__echo"
        assert ISO_Z.match(event["at"]), event["at"]
        assert event["invocationId"] == body["invocationId"]
    assert start["seq"] == 1 and result["seq"] == 2
    assert datetime.fromisoformat(start["at"]) <= datetime.fromisoformat(result["at"])
    # Redacted: test__echo keeps only `text`, in args and in the result.
    assert start["args"] == {"text": "hi there"}
    assert result["ok"] is True
    assert result["result"] == {"text": "hi there"}
    assert isinstance(result["durationMs"], int) and result["durationMs"] >= 0
    assert "hunter2" not in str(start) + str(result)


def test_after_replays_only_later_events_then_continues_live_without_gap_or_duplicate(server, acme):
    client = KeyClient(server, acme.key)
    echo(client, "run-resume", 3)  # seq 1..6
    with open_ws(server, "/ws/v1/runs/run-resume/?after=2", bearer(acme)) as ws:
        replayed = events(ws, 4)
        echo(client, "run-resume", 2)  # seq 7..10
        live = events(ws, 4)
        nothing_arrives(ws)
    assert seqs(replayed) == [3, 4, 5, 6]
    assert seqs(replayed + live) == list(range(3, 11))
    assert [e["type"] for e in replayed + live] == ["tool_call_start", "tool_call_result"] * 4


def test_the_seam_between_replay_and_live_has_no_gap_or_duplicate_under_load(server, acme):
    """Calls keep landing while clients connect, so events are committed between a
    consumer joining the run's group and reading the database: each of many streams,
    opened at different points, must be exactly after+1, after+2, ... with no repeat."""
    client = KeyClient(server, acme.key)
    echo(client, "run-seam", 3)  # seq 1..6
    stop = threading.Event()

    def produce() -> None:
        while not stop.is_set():
            echo(client, "run-seam", 1)

    with ThreadPoolExecutor(4) as pool:
        producers = [pool.submit(produce) for _ in range(4)]
        try:
            for attempt in range(15):
                after = 2 + attempt
                with open_ws(server, f"/ws/v1/runs/run-seam/?after={after}", bearer(acme)) as ws:
                    received = []
                    deadline = time.monotonic() + 0.3
                    while time.monotonic() < deadline:
                        with suppress(TimeoutError):
                            received.append(json.loads(ws.recv(timeout=0.1)))
                expected = list(range(after + 1, after + 1 + len(received)))
                assert seqs(received) == expected, f"stream opened with after={after}"
                assert received, "no event arrived while calls were being made"
        finally:
            stop.set()
            for producer in producers:
                producer.result(timeout=60)
    with open_ws(server, "/ws/v1/runs/run-seam/", bearer(acme)) as ws:
        everything = []
        try:
            while True:
                everything.append(json.loads(ws.recv(timeout=QUIET)))
        except TimeoutError:
            pass
    assert seqs(everything) == list(range(1, len(everything) + 1))
    assert len(everything) % 2 == 0


def test_a_start_always_precedes_its_result_live_and_replayed(server, acme):
    client = KeyClient(server, acme.key)
    with open_ws(server, "/ws/v1/runs/run-order/", bearer(acme)) as ws:
        with ThreadPoolExecutor(5) as pool:
            calls = list(pool.map(lambda i: echo(client, "run-order", 2), range(5)))
        live = events(ws, 20)
    with open_ws(server, "/ws/v1/runs/run-order/", bearer(acme)) as ws:
        replayed = events(ws, 20)

    call_ids = {call_id for pair in calls for call_id in pair}
    for received in (live, replayed):
        assert seqs(received) == list(range(1, 21))
        assert {e["toolCallId"] for e in received} == call_ids
        for call_id in call_ids:
            types = [e["type"] for e in received if e["toolCallId"] == call_id]
            assert types == ["tool_call_start", "tool_call_result"], (call_id, types)
    assert replayed == live


# ---------------------------------------------------------------- tickets


def test_a_stream_ticket_works_once(server, acme):
    client = KeyClient(server, acme.key)
    status, body = client.ticket("run-ticket")
    assert status == 201, body
    assert set(body) == {"ticket", "expiresAt"}
    expires = datetime.fromisoformat(body["expiresAt"])
    assert timedelta(seconds=50) < expires - timezone.now() <= timedelta(seconds=61)

    path = f"/ws/v1/runs/run-ticket/?ticket={body['ticket']}"
    with open_ws(server, path) as ws:
        echo(client, "run-ticket", 1)
        assert [e["type"] for e in events(ws, 2)] == ["tool_call_start", "tool_call_result"]
    assert refusal(server, path) == 4403


def test_an_expired_ticket_is_refused(server, acme):
    status, body = KeyClient(server, acme.key).ticket("run-ticket")
    assert status == 201, body
    digest = hashlib.sha256(body["ticket"].encode()).hexdigest()
    expired = StreamTicket.objects.filter(token_hash=digest).update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )
    assert expired == 1
    assert refusal(server, f"/ws/v1/runs/run-ticket/?ticket={body['ticket']}") == 4403


def test_a_ticket_for_another_run_is_refused(server, acme):
    status, body = KeyClient(server, acme.key).ticket("run-one")
    assert status == 201, body
    assert refusal(server, f"/ws/v1/runs/run-two/?ticket={body['ticket']}") == 4403


def test_a_made_up_ticket_is_refused_even_with_a_valid_key(server, acme):
    assert refusal(server, "/ws/v1/runs/run-x/?ticket=not-a-ticket", bearer(acme)) == 4403


# ---------------------------------------------------------------- who may listen


def test_no_credentials_are_refused(server, acme):
    assert refusal(server, "/ws/v1/runs/run-x/") == 4403


def test_an_unknown_or_revoked_key_is_refused(server, acme):
    assert refusal(server, "/ws/v1/runs/run-x/", {"Authorization": "Bearer th_nope_x"}) == 4403
    acme_key = acme.tenant.api_keys.get()
    acme_key.revoked_at = timezone.now()
    acme_key.save(update_fields=["revoked_at"])
    assert refusal(server, "/ws/v1/runs/run-x/", bearer(acme)) == 4403


def test_another_tenant_sees_none_of_a_runs_events_under_the_same_run_id(server, acme, globex):
    """Run ids belong to a tenant: globex subscribing to acme's run id gets globex's run."""
    a, b = KeyClient(server, acme.key), KeyClient(server, globex.key)
    echo(a, "shared-run", 1)  # already persisted when globex connects
    with (
        open_ws(server, "/ws/v1/runs/shared-run/", bearer(globex)) as theirs,
        open_ws(server, "/ws/v1/runs/shared-run/?after=2", bearer(acme)) as ours,
    ):
        nothing_arrives(theirs)  # no replay of acme's events
        echo(a, "shared-run", 1)  # nor live ones
        assert seqs(events(ours, 2)) == [3, 4]
        nothing_arrives(theirs)

        [own_call] = echo(b, "shared-run", 1)
        own = events(theirs, 2)
        nothing_arrives(theirs)
        nothing_arrives(ours, 0.3)
    assert [(e["seq"], e["toolCallId"]) for e in own] == [(1, own_call), (2, own_call)]


def test_a_ticket_of_one_tenant_does_not_open_another_tenants_run(server, acme, globex):
    echo(KeyClient(server, acme.key), "shared-run", 1)
    status, body = KeyClient(server, globex.key).ticket("shared-run")
    assert status == 201, body
    with open_ws(server, f"/ws/v1/runs/shared-run/?ticket={body['ticket']}") as ws:
        nothing_arrives(ws)


def test_a_malformed_after_is_refused_with_4400(server, acme):
    malformed = ["-1", "abc", "1.5", "1e3", "0x10", "%201", "9" * 19]
    outcomes = {
        after: refusal(server, f"/ws/v1/runs/run-x/?after={after}", bearer(acme))
        for after in malformed
    }
    assert outcomes == dict.fromkeys(malformed, 4400)


def test_a_staff_session_receives_its_tenants_run_events(server, acme):
    staff = operator("olga", acme.tenant)
    browser = logged_in(server, staff)
    with open_ws(server, "/ws/v1/runs/run-staff/", browser.ws_headers) as ws:
        [call_id] = echo(KeyClient(server, acme.key), "run-staff", 1)
        received = events(ws, 2)
    assert [(e["type"], e["toolCallId"]) for e in received] == [
        ("tool_call_start", call_id),
        ("tool_call_result", call_id),
    ]


def test_a_staff_session_from_another_sites_page_is_refused(server, acme):
    """The Origin check stops a foreign page from riding on a staff member's cookie."""
    browser = logged_in(server, operator("olga", acme.tenant))
    headers = {**browser.ws_headers, "Origin": "http://evil.example"}
    assert refusal(server, "/ws/v1/runs/run-staff/", headers) == "HTTP 403"


def test_a_staff_member_of_no_tenant_is_refused(server, acme):
    nomad = User.objects.create_user("nomad", password="pw-nomad-123", is_staff=True)
    browser = logged_in(server, nomad)
    assert refusal(server, "/ws/v1/runs/run-staff/", browser.ws_headers) == 4403


# ---------------------------------------------------------------- floods


def test_a_flood_of_streams_from_one_principal_is_capped_and_a_closed_one_frees_a_slot(acme):
    path = "/ws/v1/runs/run-flood/"
    with daphne({"TOOLHUB_WS_MAX_PER_PRINCIPAL": "3"}) as capped, ExitStack() as stack:
        first, *others = [
            stack.enter_context(open_ws(capped, path, bearer(acme))) for _ in range(3)
        ]
        assert refusal(capped, path, bearer(acme)) == 4429
        # Another principal of the tenant has slots of its own.
        colleague = make_agent("acme", "agent:colleague")
        with open_ws(capped, path, bearer(colleague)) as theirs:
            nothing_arrives(theirs, 0.2)

        # The accepted streams stayed open and live.
        echo(KeyClient(capped, acme.key), "run-flood", 1)
        for ws in (first, *others):
            assert seqs(events(ws, 2)) == [1, 2]

        first.close()
        deadline = time.monotonic() + 10
        while True:  # the server notices the close a moment later
            try:
                again = stack.enter_context(open_ws(capped, path, bearer(acme)))
                assert seqs(events(again, 2, timeout=2)) == [1, 2]
                break
            except (ConnectionClosed, AssertionError):
                assert time.monotonic() < deadline, "closing a stream did not free its slot"
                time.sleep(0.2)
        # Refused streams took no slot, and the freed one is taken again.
        assert refusal(capped, path, bearer(acme)) == 4429


# ---------------------------------------------------------------- slow clients

SLOW_CLIENTS = 4
CALLS = 1000  # 2,000 events: a start and a ~30 KB result each
RESULT_BYTES = 30_000
WARM_UP_CALLS = 200
# Unbounded buffering holds every event for every non-reading client:
# 4 x 1,000 x 30 KB = 120 MB. A bounded server holds a few seconds' worth.
GROWTH_BUDGET_MB = 40
# What a server holds for a stalled client is what it sends it until it drops it.
STALL_LIMIT_S = 20
TCP_ESTABLISHED = 1


def rss_mb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) // 1024
    raise AssertionError(f"no VmRSS for process {pid}")


def never_reading_client(port: int, path: str, key: str) -> socket.socket:
    """A WebSocket client that completes the handshake and then never reads again,
    with a tiny receive buffer, so what it is sent piles up in the server."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(10)
    sock.connect(("127.0.0.1", port))
    nonce = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(
        (
            f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {nonce}\r\n"
            f"Sec-WebSocket-Version: 13\r\nAuthorization: Bearer {key}\r\n\r\n"
        ).encode()
    )
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(1)
        assert chunk, f"the server closed the handshake: {head!r}"
        head += chunk
    assert head.startswith(b"HTTP/1.1 101"), head
    return sock


def still_connected(sock: socket.socket) -> bool:
    """Whether the server has not closed or reset the connection, read without reading
    the socket (TCP_INFO's first byte is the Linux TCP state)."""
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0] == TCP_ESTABLISHED


# Daphne's memory and keepalives, not the database: one leg (the gate's legs are balanced
# by these two, its slowest tests).
@pytest.mark.one_leg("postgresql")
@pytest.mark.parametrize(
    "daphne_args",
    [
        pytest.param(RECOMMENDED_ARGS, id="recommended-keepalive"),
        pytest.param(("--ping-interval", "2", "--ping-timeout", "3"), id="short-keepalive"),
    ],
)
def test_clients_that_never_read_are_dropped_and_do_not_grow_server_memory_without_bound(
    test_tools, daphne_args
):
    agent = make_agent("acme")
    allow(agent.tenant, "test__big_output")
    with daphne(args=daphne_args) as server:
        client = KeyClient(server, agent.key)

        def burst(calls: int, run_id: str) -> None:
            with ThreadPoolExecutor(4) as pool:
                list(
                    pool.map(
                        lambda _: client.invoke(
                            "test__big_output", args={"size": RESULT_BYTES}, runId=run_id
                        ),
                        range(calls),
                    )
                )

        burst(WARM_UP_CALLS, "run-warm-up")  # caches, pools and the allocator settle first
        base = rss_mb(server.pid)
        connected_at = time.monotonic()
        slow = [
            never_reading_client(server.port, "/ws/v1/runs/run-slow/", agent.key)
            for _ in range(SLOW_CLIENTS)
        ]
        dropped_after: dict[int, float] = {}
        samples = [base]
        stop = threading.Event()

        def watch() -> None:
            while not stop.wait(0.2):
                samples.append(rss_mb(server.pid))
                for index, sock in enumerate(slow):
                    if index not in dropped_after and not still_connected(sock):
                        dropped_after[index] = time.monotonic() - connected_at

        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            burst(CALLS, "run-slow")
            produced_in = time.monotonic() - connected_at
            growth = max(samples) - base
            deadline = time.monotonic() + 70
            while len(dropped_after) < SLOW_CLIENTS and time.monotonic() < deadline:
                time.sleep(0.5)
        finally:
            stop.set()
            watcher.join()
            for sock in slow:
                sock.close()

        report = (
            f"{2 * CALLS} events produced in {produced_in:.0f} s for {SLOW_CLIENTS} clients "
            f"that never read; Daphne grew by {growth} MB (from {base} MB); the clients were "
            f"dropped after {sorted(round(t) for t in dropped_after.values())} s"
        )
        assert len(dropped_after) == SLOW_CLIENTS, report
        assert max(dropped_after.values()) <= STALL_LIMIT_S, report
        assert growth < GROWTH_BUDGET_MB, report


def read_whole_run(server: str, path: str, agent, count: int) -> int:
    """Read a run to its end as a well-behaved client does: when the server closes a
    stream that needed pacing too long (`stream_lagging`, then 4008), reconnect after the
    last seq seen, which is the one the server said."""
    last = 0
    deadline = time.monotonic() + 120
    while last < count and time.monotonic() < deadline:
        try:
            with open_ws(server, f"{path}?after={last}", bearer(agent)) as ws:
                while last < count:
                    message = json.loads(ws.recv(timeout=30))
                    if message["type"] == "stream_lagging":  # then 4008
                        assert message["resumeAfter"] == last, message
                        continue
                    last = message["seq"]
        except ConnectionClosed as closed:
            assert closed.rcvd is not None and closed.rcvd.code == 4008, closed
    return last


@pytest.mark.one_leg("sqlite")
def test_replaying_a_long_run_to_clients_that_never_read_does_not_pin_its_history(test_tools):
    """A valid key and ?after=0 on a run with a long history, opened several times and
    never read: the server must not hold the history once per connection."""
    from apps.invocations import events as run_events

    agent = make_agent("acme")
    for run, calls in (("run-warm-up", WARM_UP_CALLS), ("run-history", CALLS)):
        for seq in range(1, calls + 1):
            run_events.emit(
                agent.tenant,
                run,
                "tool_call_result",
                tool_call_id=f"call-{seq}",
                tool_id="test__big_output",
                ok=True,
                result={"blob": "x" * RESULT_BYTES},
                durationMs=1,
            )
    with daphne() as server:
        # A reading client first, over a shorter run of the same events (at the stream's
        # byte budget the long one takes two minutes): caches and the allocator settle.
        path = "/ws/v1/runs/run-warm-up/"
        assert read_whole_run(server, path, agent, WARM_UP_CALLS) == WARM_UP_CALLS
        time.sleep(1)
        base = rss_mb(server.pid)
        connected_at = time.monotonic()
        slow = [
            never_reading_client(server.port, "/ws/v1/runs/run-history/", agent.key)
            for _ in range(SLOW_CLIENTS)
        ]
        try:
            peak = base
            while time.monotonic() - connected_at < 5:
                peak = max(peak, rss_mb(server.pid))
                time.sleep(0.2)
            assert peak - base < GROWTH_BUDGET_MB, (
                f"Daphne grew by {peak - base} MB (from {base} MB) replaying "
                f"{CALLS} x {RESULT_BYTES // 1000} KB events to {SLOW_CLIENTS} clients "
                "that never read"
            )
            while any(map(still_connected, slow)):
                assert time.monotonic() - connected_at <= STALL_LIMIT_S, (
                    "clients that never read are still connected"
                )
                time.sleep(0.5)
        finally:
            for sock in slow:
                sock.close()
