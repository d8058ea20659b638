"""During a database outage, every request answers 503 with Retry-After and a JSON body.

Without this, each request during a PostgreSQL restart was a 500 "Internal server
error" with a traceback in the log. Clients get what they can act on (retry in a
few seconds) and the log gets one line per outage.
"""

from __future__ import annotations

import logging
import threading
import time

from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils.deprecation import MiddlewareMixin
from psycopg_pool import PoolTimeout

from toolhub.db.postgresql.pool import reachability

logger = logging.getLogger(__name__)

RETRY_AFTER_S = 5
# Errors closer together than this belong to the same outage (logged once).
SAME_OUTAGE_S = 30.0


class Outages:
    def __init__(
        self, message: str = "database unavailable (%s: %s); answering 503 until it is back"
    ) -> None:
        self._lock = threading.Lock()
        self._last_error: float | None = None
        self._message = message

    def seen(self, error: BaseException) -> bool:
        """Note a database error; True when it starts a new outage (then it is logged)."""
        now = time.monotonic()
        with self._lock:
            new = self._last_error is None or now - self._last_error > SAME_OUTAGE_S
            self._last_error = now
        if new:
            first = (str(error).strip().splitlines() or [""])[0]
            logger.error(
                self._message,
                type(error).__name__,
                first,
            )
        return new


outages = Outages()
# Every pooled connection in use for the pool's whole timeout: not an outage, but the
# operator must hear of it (TOOLHUB_DB_POOL_MAX_SIZE, docs/deployment.md).
exhaustions = Outages(
    "no pooled database connection came free in time (%s: %s); answering 503 meanwhile"
)

_UNANSWERED = "its database is not answering"
_BUSY = "all its database connections are in use"


def unavailable(reason: str = _UNANSWERED) -> HttpResponse:
    response = JsonResponse(
        {
            "detail": f"The service is briefly unavailable ({reason}); "
            f"retry in {RETRY_AFTER_S} seconds.",
            "retryAfterSeconds": RETRY_AFTER_S,
        },
        status=503,
    )
    response["Retry-After"] = str(RETRY_AFTER_S)
    # Logged once per outage above, not once per request by django.request.
    response._has_been_logged = True  # type: ignore[attr-defined]
    return response


class DatabaseOutageMiddleware(MiddlewareMixin):
    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if not isinstance(exception, OperationalError | InterfaceError):
            return None
        # The pool's timeout while its attempts to connect fail is an outage.
        if isinstance(exception.__cause__, PoolTimeout) and not reachability.down:
            exhaustions.seen(exception)
            return unavailable(_BUSY)
        outages.seen(exception)
        return unavailable()
