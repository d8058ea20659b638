"""Django's ASGI handler, with a request's synchronous work run in one crossing to one thread
(issue 13).

Django's own ASGI handler runs the middleware chain asynchronously. toolhub's views and
middleware are synchronous, so every hook of every middleware (`process_request`,
`process_view`, `process_response`) became a hand-over from the event loop to the
request's thread and back: sixteen per API request, and each waited behind every
other request the loop is serving. Under 50 concurrent calls the median call's tool
started 220-300 ms after the burst began; with the chain in one crossing, 135-175 ms.

Here the chain is built synchronously, as under WSGI, and a request crosses to its thread
once (`_respond`): request_started's receivers, the chain with the view and, for a
response that is not streamed, its closing (request_finished's receivers) run there in
one go. Django's handler made three crossings of it; each crossing wakes the thread and
then the loop, and hands Python's lock between them, which measured 13-15 % of a
process's calls per second (docs/performance.md). A response that is not streamed is
complete when the view returns it, so its closing (on PostgreSQL, the connection back to
the pool) comes before its bytes are handed to the server rather than after; a streamed
response is sent first and closed after, in a crossing of its own, as Django does. The
rest is Django's: the body is read and the response sent on the loop, and a client that
disconnects while the view runs ends the request (the view's thread finishes its work,
whose answer is dropped). Everything sync a request runs, runs on one thread of its own
(`ThreadSensitiveContext`), so its database connection is used there only.

That thread is kept for a later request (`RequestThreads`). Django's handler gives each
request a new single-thread executor and, when the request ends, starts another thread to
shut it down: two threads started and joined per request, about 5 % of a sequential
call's CPU (issue 13). A request's thread is handed on only once nothing of the request
runs on it any more; what a request leaves on its thread is what it would leave under a
WSGI server's thread pool: on PostgreSQL its connection goes back to the pool at
`request_finished`, on SQLite the thread keeps its open connection for the next request
(`CONN_MAX_AGE=None`, toolhub/settings.py), and Django's request state lives in context
variables, which each hand-over copies afresh.

toolhub has no asynchronous Django view: paths that need the raw ASGI connection are
served outside Django (toolhub/routing.py). An async view would still work here, run to
completion on the request's thread.
"""

from __future__ import annotations

import asyncio
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import closing
from typing import Any

import django
from asgiref.sync import ThreadSensitiveContext, sync_to_async
from django.core import signals
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.http import FileResponse
from django.urls import set_script_prefix

KEPT_THREADS = 32  # idle request threads kept per process; a burst's extra ones end


class RequestThread(ThreadPoolExecutor):
    """One request's thread: a single-thread executor that knows whether work is left."""

    def __init__(self) -> None:
        super().__init__(max_workers=1, thread_name_prefix="toolhub-request")
        self._lock = threading.Lock()
        self._pending = 0

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Future[Any]:
        with self._lock:
            self._pending += 1
        try:
            future = super().submit(fn, *args, **kwargs)
        except BaseException:
            self._done()
            raise
        future.add_done_callback(self._done)
        return future

    def _done(self, *_: object) -> None:
        with self._lock:
            self._pending -= 1

    @property
    def idle(self) -> bool:
        with self._lock:
            return self._pending == 0


class RequestThreads:
    """The idle request threads of this process, handed out one per request.

    Taken and given back on the event loop. A thread still running something of its last
    request (a cancelled hand-over can leave one) is not handed on: it ends once done. A
    forked child drops its parent's (their threads are not in the child).
    """

    def __init__(self, keep: int = KEPT_THREADS) -> None:
        self.keep = keep
        self._idle: list[RequestThread] = []
        self._pid = os.getpid()

    def take(self) -> RequestThread:
        if self._pid != os.getpid():
            self._idle, self._pid = [], os.getpid()
        try:
            return self._idle.pop()
        except IndexError:
            return RequestThread()

    def give(self, thread: RequestThread) -> None:
        if thread.idle and self._pid == os.getpid() and len(self._idle) < self.keep:
            self._idle.append(thread)
        else:
            thread.shutdown(wait=False)  # its thread ends after its last work

    def __len__(self) -> int:
        return len(self._idle)


class OneThreadASGIHandler(ASGIHandler):
    def __init__(self) -> None:
        super().__init__()
        self.threads = RequestThreads()
        # Built once: building asgiref's wrapper per request was 1 % of the loop's time.
        self._respond_on_thread = sync_to_async(self._respond, thread_sensitive=True)

    def load_middleware(self, is_async: bool = False) -> None:
        super().load_middleware(is_async=False)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            raise ValueError(f"Django can only handle ASGI/HTTP connections, not {scope['type']}.")
        thread = self.threads.take()
        try:
            # The caller owns the executor: leaving the context does not shut it down.
            async with ThreadSensitiveContext(executor=thread):
                await self.handle(scope, receive, send)
            if not thread.idle:
                # The client left while the view ran: its thread finishes the request's
                # work, which may need this loop (a call's events are sent on it), so the
                # request ends with that work and a stopping server waits for it
                # (toolhub/server/draining.py).
                await asyncio.wrap_future(thread.submit(_nothing))
        finally:
            self.threads.give(thread)

    async def handle(self, scope: Any, receive: Any, send: Any) -> None:
        """Django's `handle`, with request_started's receivers, the chain and the closing
        of a response that is not streamed run in the one crossing to the request's thread
        (`_respond`). A streamed response is closed after it is sent, as Django does."""
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return
        with closing(body_file):
            set_script_prefix(get_script_prefix(scope))
            response = None
            try:
                try:
                    async with asyncio.TaskGroup() as group:
                        group.create_task(self.listen_for_disconnect(receive))
                        response = await self._respond_on_thread(scope, body_file)
                        await self.send_response(response, send)
                        raise _Processed
                except* (_Processed, RequestAborted):
                    pass
            except BaseExceptionGroup as group_error:
                if len(group_error.exceptions) == 1:
                    raise group_error.exceptions[0] from None
                raise
            # A client that left before the answer was ready needs no request_finished here
            # (Django sends one): `_respond` either ends on the request's thread, closing
            # its response, or never began.
            if response is not None and response.streaming:
                await sync_to_async(response.close, thread_sensitive=True)()

    def _respond(self, scope: Any, body_file: Any) -> Any:
        signals.request_started.send(sender=self.__class__, scope=scope)
        request, response = self.create_request(scope, body_file)
        if request is not None:
            response = self.get_response(request)
            response._handler_class = self.__class__  # type: ignore[attr-defined]  # as Django
            if isinstance(response, FileResponse):
                response.block_size = self.chunk_size
        assert response is not None  # create_request answers a request or an error
        if not response.streaming:
            response.close()  # its content is complete: request_finished before the send
        return response

    async def get_response_async(self, request: Any) -> Any:
        return await sync_to_async(self.get_response, thread_sensitive=True)(request)


def _nothing() -> None:
    """Queued behind a request's last work on its thread: done once that work is."""


class _Processed(Exception):
    """The response was sent: ends the task group that listens for a disconnect."""


def get_asgi_application() -> OneThreadASGIHandler:
    """django.core.asgi.get_asgi_application, with this handler."""
    django.setup(set_prefix=False)
    return OneThreadASGIHandler()
