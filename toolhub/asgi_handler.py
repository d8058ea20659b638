"""Django's ASGI handler, with a request's middleware and view run in one thread (issue 13).

Django's own ASGI handler runs the middleware chain asynchronously. toolhub's views and
middleware are synchronous, so every hook of every middleware (`process_request`,
`process_view`, `process_response`) became a hand-over from the event loop to the
request's thread and back: sixteen per API request, and each waited behind every
other request the loop is serving. Under 50 concurrent calls the median call's tool
started 220-300 ms after the burst began; with this handler, 135-175 ms.

Here the chain is built synchronously, as under WSGI, and a request crosses to its thread
once for all of it. The rest is Django's: the request's body is read, the response sent
and the request_started / request_finished signals sent on the loop, and everything sync
a request runs (the signals' receivers, the chain, the response's closing) runs on one
thread of its own (`ThreadSensitiveContext`), so its database connection is used there
only.

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

import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import django
from asgiref.sync import ThreadSensitiveContext, sync_to_async
from django.core.handlers.asgi import ASGIHandler

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
        finally:
            self.threads.give(thread)

    async def get_response_async(self, request: Any) -> Any:
        return await sync_to_async(self.get_response, thread_sensitive=True)(request)


def get_asgi_application() -> OneThreadASGIHandler:
    """django.core.asgi.get_asgi_application, with this handler."""
    django.setup(set_prefix=False)
    return OneThreadASGIHandler()
