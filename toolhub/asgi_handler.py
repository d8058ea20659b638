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
thread of its own (`ThreadSensitiveContext`), so its database connection is opened and
closed there as before.

toolhub has no asynchronous Django view: paths that need the raw ASGI connection are
served outside Django (toolhub/routing.py). An async view would still work here, run to
completion on the request's thread.
"""

from __future__ import annotations

from typing import Any

import django
from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIHandler


class OneThreadASGIHandler(ASGIHandler):
    def load_middleware(self, is_async: bool = False) -> None:
        super().load_middleware(is_async=False)

    async def get_response_async(self, request: Any) -> Any:
        return await sync_to_async(self.get_response, thread_sensitive=True)(request)


def get_asgi_application() -> OneThreadASGIHandler:
    """django.core.asgi.get_asgi_application, with this handler."""
    django.setup(set_prefix=False)
    return OneThreadASGIHandler()
