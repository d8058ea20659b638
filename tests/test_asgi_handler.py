"""A request through toolhub's ASGI handler crosses to its thread once (issue 13).

Django's own ASGI handler ran every hook of every synchronous middleware as a separate
hand-over from the event loop to the request's thread and back. toolhub's handler
(toolhub/server/asgi_handler.py) runs the whole chain and the view in one crossing; what it
answers must not change.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from asgiref.sync import SyncToAsync, sync_to_async
from django.core.handlers.asgi import ASGIHandler
from django.test import override_settings

from tests.conftest import allow, make_agent
from toolhub.server.asgi_handler import OneThreadASGIHandler

pytestmark = pytest.mark.django_db(transaction=True)


async def request(
    app: Any,
    method: str,
    path: str,
    headers: list[tuple[bytes, bytes]],
    body: bytes = b"",
    log: list[tuple[str, int]] | None = None,
) -> tuple[int, dict[str, str], bytes]:
    """One request through `app`; `log` gets each message's type as it is sent."""
    incoming = [{"type": "http.request", "body": body, "more_body": False}]
    if body:
        headers = [*headers, (b"content-length", str(len(body)).encode())]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if incoming:
            return incoming.pop(0)
        await _forever()
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)
        if log is not None:
            log.append((message["type"], 0))

    await app(http_scope(method, path, headers), receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    content = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    headers_out = {k.decode().lower(): v.decode() for k, v in start["headers"]}
    return start["status"], headers_out, content


def http_scope(method: str, path: str, headers: list[tuple[bytes, bytes]]) -> dict[str, Any]:
    return {
        "type": "http", "method": method, "path": path, "raw_path": path.encode(),
        "query_string": b"", "root_path": "", "scheme": "http", "http_version": "1.1",
        "headers": [(b"host", b"testserver"), *headers], "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }  # fmt: skip


async def _forever() -> None:
    import asyncio

    await asyncio.Event().wait()  # no disconnect: the response ends the request


@contextmanager
def crossings() -> Iterator[list[int]]:
    """Count the loop-to-thread hand-overs (sync_to_async calls) and the threads used."""
    counted: list[int] = []
    original = SyncToAsync.__call__

    async def counting(self: Any, *args: Any, **kwargs: Any) -> Any:
        counted.append(1)
        return await original(self, *args, **kwargs)

    SyncToAsync.__call__ = counting  # type: ignore[method-assign]
    try:
        yield counted
    finally:
        SyncToAsync.__call__ = original  # type: ignore[method-assign]


def caller() -> tuple[list[tuple[bytes, bytes]], str]:
    agent = make_agent("asgi-handler")
    allow(agent.tenant, "core__get_current_time")
    return [(b"authorization", f"Bearer {agent.key}".encode())], agent.key


async def test_a_call_crosses_to_its_thread_once_for_the_whole_chain():
    headers, _ = await sync_to_async(caller)()
    body = json.dumps({"toolId": "core__get_current_time"}).encode()
    headers = [*headers, (b"content-type", b"application/json")]
    with crossings() as ours:
        status, _, content = await request(
            OneThreadASGIHandler(), "POST", "/api/v1/invocations/", headers, body
        )
    assert status == 200, content[:300]
    assert json.loads(content)["status"] == "succeeded"
    with crossings() as django_s:
        status, _, content = await request(
            ASGIHandler(), "POST", "/api/v1/invocations/", headers, body
        )
    assert status == 200, content[:300]
    # request_started's receivers, the chain with the view and the response's closing,
    # all in one crossing.
    assert len(ours) == 1
    # What it replaces: a crossing per middleware hook.
    assert len(django_s) > 10


@contextmanager
def signalled() -> Iterator[list[tuple[str, int]]]:
    """request_started's and request_finished's receivers, noting the thread they ran on."""
    from django.core import signals

    seen: list[tuple[str, int]] = []

    def started(**_: Any) -> None:
        seen.append(("started", threading.get_ident()))

    def finished(**_: Any) -> None:
        seen.append(("finished", threading.get_ident()))

    signals.request_started.connect(started, weak=False)
    signals.request_finished.connect(finished, weak=False)
    try:
        yield seen
    finally:
        signals.request_started.disconnect(started)
        signals.request_finished.disconnect(finished)


async def test_the_signals_run_on_the_requests_thread_once_each():
    """request_started and request_finished each fire once per request, on the thread the
    chain runs on, not on the loop; an answer that is not streamed is closed before its
    bytes leave, so request_finished has fired when the server gets them."""
    from django.conf import settings

    outer = "tests.test_asgi_handler._Threads"
    _Threads.seen = []
    headers, _ = await sync_to_async(caller)()
    with override_settings(MIDDLEWARE=[outer, *settings.MIDDLEWARE]), signalled() as seen:
        app = OneThreadASGIHandler()
        for path, expected in (("/api/v1/tools/", 200), ("/no/such/path/", 404)):
            before = len(seen)
            status, _, _ = await request(app, "GET", path, headers, log=seen)
            assert status == expected
            assert [name for name, _ in seen[before:]] == [
                "started", "finished", "http.response.start", "http.response.body"
            ]  # fmt: skip
    threads = {ident for name, ident in seen if not name.startswith("http.")} | set(_Threads.seen)
    assert len(threads) == 1  # the kept request thread, for both requests
    assert threading.get_ident() not in threads


async def test_a_request_django_cannot_build_gets_its_error_closed_once(
    monkeypatch: pytest.MonkeyPatch,
):
    """When Django cannot build the request (a body over its limit, a path it cannot
    decode), its error answer is sent and closed like any other, in the one crossing."""
    from django.http import HttpResponse

    app = OneThreadASGIHandler()

    def refuse(scope: Any, body_file: Any) -> tuple[None, HttpResponse]:
        return None, HttpResponse("413 Payload too large", status=413)

    monkeypatch.setattr(app, "create_request", refuse)
    with crossings() as crossed, signalled() as seen:
        status, _, content = await request(app, "POST", "/api/v1/invocations/", [], b"{}", seen)
    assert status == 413
    assert content == b"413 Payload too large"
    assert len(crossed) == 1
    assert [name for name, _ in seen] == [
        "started", "finished", "http.response.start", "http.response.body"
    ]  # fmt: skip


async def test_a_streamed_answer_is_closed_after_it_is_sent():
    """A streamed response is sent on the loop, chunk by chunk, and only then closed in a
    crossing of its own: request_finished comes after its last body message."""
    sent: list[dict[str, Any]] = []
    incoming = [{"type": "http.request", "body": b"", "more_body": False}]

    async def receive() -> dict[str, Any]:
        if incoming:
            return incoming.pop(0)
        await _forever()
        raise AssertionError("unreachable")

    scope = http_scope("GET", "/streamed/", [])
    with override_settings(ROOT_URLCONF="tests.test_asgi_handler"), signalled() as seen:

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)
            seen.append((message["type"], 0))

        await OneThreadASGIHandler()(scope, receive, send)
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    assert body == b"one,two,three"
    order = [name for name, _ in seen]
    assert order[0] == "started"
    assert order[1] == "http.response.start"
    assert order[-2:] == ["http.response.body", "finished"]  # closed after its last chunk
    assert order.count("finished") == 1


def _streamed(request: Any) -> Any:
    from django.http import StreamingHttpResponse

    async def chunks() -> Any:
        for chunk in (b"one,", b"two,", b"three"):
            yield chunk

    return StreamingHttpResponse(chunks())


async def test_a_client_that_leaves_before_the_answer_ends_the_request():
    """A disconnect while the view runs: nothing is sent, the view's thread finishes its
    work, the request ends with it, and request_finished still fires, once (on PostgreSQL
    the connection goes back)."""
    import asyncio

    entered, leave = threading.Event(), asyncio.Event()
    sent: list[dict[str, Any]] = []
    incoming = [{"type": "http.request", "body": b"", "more_body": False}]

    async def receive() -> dict[str, Any]:
        if incoming:
            return incoming.pop(0)
        await leave.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = http_scope("GET", "/slow/", [])
    _Slow.entered, _Slow.release = entered, threading.Event()
    with override_settings(ROOT_URLCONF="tests.test_asgi_handler"), signalled() as seen:
        app = OneThreadASGIHandler()
        task = asyncio.ensure_future(app(scope, receive, send))
        assert await asyncio.to_thread(entered.wait, 20)
        leave.set()  # the client leaves while the view still runs
        await asyncio.sleep(0.05)
        # The request ends with its thread's work, which may need this loop: a stopping
        # server waits for it (toolhub/server/draining.py).
        assert not task.done()
        _Slow.release.set()
        await asyncio.wait_for(task, 20)
        names = [name for name, _ in seen]  # the view's own closing ran on its thread
    assert sent == []
    assert names == ["started", "finished"]  # once each, as for a request answered
    assert len(app.threads) == 1  # done with the request's work: kept for the next one


class _Slow:
    entered = threading.Event()
    release = threading.Event()


def _slow(request: Any) -> Any:
    from django.http import HttpResponse

    _Slow.entered.set()
    _Slow.release.wait(20)
    return HttpResponse(b"too late")


urlpatterns: list[Any] = []


def _urls() -> None:
    from django.urls import path

    urlpatterns.extend([path("streamed/", _streamed), path("slow/", _slow)])


_urls()


class _Threads:
    """A middleware noting the thread it ran on, first and last in the chain."""

    seen: list[int] = []

    def __init__(self, get_response: Any) -> None:
        self.get_response = get_response

    def __call__(self, request: Any) -> Any:
        _Threads.seen.append(threading.get_ident())
        response = self.get_response(request)
        _Threads.seen.append(threading.get_ident())
        return response


async def test_the_chain_and_the_view_run_on_one_thread_off_the_loop():
    from django.conf import settings

    outer = "tests.test_asgi_handler._Threads"
    _Threads.seen = []
    with override_settings(MIDDLEWARE=[outer, *settings.MIDDLEWARE, outer]):
        status, _, content = await request(OneThreadASGIHandler(), "GET", "/healthz", [])
    assert status == 200, content[:300]
    assert len(_Threads.seen) == 4
    assert len(set(_Threads.seen)) == 1
    assert _Threads.seen[0] != threading.get_ident()  # not the event loop's thread


async def test_refusals_and_errors_answer_as_before():
    """No key: the API's 401 with its JSON body; an unknown path: 404; a bad body: 400."""
    app = OneThreadASGIHandler()
    status, headers, content = await request(app, "GET", "/api/v1/tools/", [])
    assert status == 401
    assert headers["content-type"].startswith("application/json")
    assert "detail" in json.loads(content)

    status, _, _ = await request(app, "GET", "/no/such/path/", [])
    assert status == 404

    auth, _ = await sync_to_async(caller)()
    status, _, content = await request(
        app,
        "POST",
        "/api/v1/invocations/",
        [*auth, (b"content-type", b"application/json")],
        b"{not json",
    )
    assert status == 400, content[:300]
    assert "detail" in json.loads(content)


async def test_the_epoch_is_read_once_per_request(monkeypatch: pytest.MonkeyPatch):
    """EpochMiddleware pins the authorization epoch for the request, on the request's
    thread. The catalog also reads the tools, the policies and the grants epochs
    (apps/tools/rows.py, apps/policies/policy.py, apps/tools/grants.py), each once."""
    from apps.tenants import epoch

    headers, _ = await sync_to_async(caller)()
    reads: list[int] = []
    original = epoch.read

    def counting_read(row: int = epoch.ROW) -> int:
        reads.append(row)
        return original(row)

    monkeypatch.setattr(epoch, "read", counting_read)
    status, _, content = await request(OneThreadASGIHandler(), "GET", "/api/v1/tools/", headers)
    assert status == 200, content[:300]
    assert sorted(reads) == [epoch.ROW, epoch.TOOLS_ROW, epoch.POLICIES_ROW, epoch.GRANTS_ROW]


class _Gather:
    """A middleware holding each request until a second one is in the chain too."""

    barrier: threading.Barrier | None = None
    seen: list[int] = []

    def __init__(self, get_response: Any) -> None:
        self.get_response = get_response

    def __call__(self, request: Any) -> Any:
        _Gather.seen.append(threading.get_ident())
        assert _Gather.barrier is not None
        _Gather.barrier.wait()  # a request sharing a thread would never get here
        return self.get_response(request)


def _open_connection() -> int | None:
    """The id of this thread's open database connection, None when it has none."""
    from django.db import connections

    found = connections["default"].connection
    return None if found is None else id(found)


async def test_a_request_thread_is_kept_for_the_next_request():
    """The later requests run on the first one's thread, and on SQLite on its database
    connection (PostgreSQL's goes back to the pool at the end of each request)."""
    from django.conf import settings
    from django.db import connection

    outer = "tests.test_asgi_handler._Threads"
    _Threads.seen = []
    headers, _ = await sync_to_async(caller)()
    held: list[int | None] = []
    with override_settings(MIDDLEWARE=[outer, *settings.MIDDLEWARE]):
        app = OneThreadASGIHandler()  # the chain is built here
        for _ in range(3):
            status, _, content = await request(app, "GET", "/api/v1/tools/", headers)
            assert status == 200, content[:300]
            assert len(app.threads) == 1
            held.append(app.threads._idle[0].submit(_open_connection).result(timeout=10))
    assert len(_Threads.seen) == 6
    assert len(set(_Threads.seen)) == 1
    if connection.vendor == "sqlite":
        assert held[0] is not None
        assert len(set(held)) == 1
    else:
        assert held == [None, None, None]


async def test_concurrent_requests_run_on_threads_of_their_own():
    import asyncio

    from django.conf import settings

    _Gather.barrier, _Gather.seen = threading.Barrier(2, timeout=20), []
    with override_settings(MIDDLEWARE=["tests.test_asgi_handler._Gather", *settings.MIDDLEWARE]):
        app = OneThreadASGIHandler()
        answers = await asyncio.gather(
            request(app, "GET", "/healthz", []), request(app, "GET", "/healthz", [])
        )
        assert [status for status, _, _ in answers] == [200, 200]
        assert len(set(_Gather.seen)) == 2
        assert len(app.threads) == 2  # both kept
        # Kept threads serve the next burst: no third thread.
        _Gather.barrier, _Gather.seen = threading.Barrier(2, timeout=20), []
        answers = await asyncio.gather(
            request(app, "GET", "/healthz", []), request(app, "GET", "/healthz", [])
        )
        assert [status for status, _, _ in answers] == [200, 200]
        assert len(app.threads) == 2


def test_a_thread_still_running_work_is_not_handed_on():
    from toolhub.server.asgi_handler import RequestThreads

    threads = RequestThreads()
    thread = threads.take()
    release = threading.Event()
    running = thread.submit(release.wait, 20)
    assert not thread.idle
    threads.give(thread)
    assert len(threads) == 0  # not kept: the next request gets another thread
    assert threads.take() is not thread
    release.set()
    assert running.result(timeout=20) is True
    assert thread.idle


def test_idle_threads_kept_are_bounded_and_the_rest_end():
    from toolhub.server.asgi_handler import RequestThreads

    threads = RequestThreads(keep=2)
    taken = [threads.take() for _ in range(3)]
    assert len({id(t) for t in taken}) == 3
    for thread in taken:
        assert thread.submit(threading.get_ident).result(timeout=10)
        threads.give(thread)
    assert len(threads) == 2
    ended = taken[2]
    with pytest.raises(RuntimeError):  # shut down: takes no more work
        ended.submit(threading.get_ident)
    assert threads.take() in taken[:2]


def test_a_forked_child_does_not_use_its_parents_threads(monkeypatch: pytest.MonkeyPatch):
    import os

    from toolhub.server import asgi_handler
    from toolhub.server.asgi_handler import RequestThreads

    threads = RequestThreads()
    parents = threads.take()
    threads.give(parents)
    assert len(threads) == 1
    child_pid = os.getpid() + 1
    monkeypatch.setattr(asgi_handler.os, "getpid", lambda: child_pid)
    fresh = threads.take()
    assert fresh is not parents
    assert len(threads) == 0
    threads.give(fresh)
    assert len(threads) == 1
