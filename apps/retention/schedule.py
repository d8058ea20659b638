"""Pruning on a schedule: the worker's sweeper calls `tick()` every few seconds.

A pass can take minutes on a large backlog, and the sweeper expires approvals, so
`tick()` never prunes itself: at most every TOOLHUB_RETENTION_EVERY_S it starts one
thread that prunes every tenant and ends (none while one still runs). Several
workers may prune at once: each batch re-reads what it deletes, so the second one
finds nothing left and records nothing.
"""

from __future__ import annotations

import logging
import threading
import time

from django.conf import settings
from django.db import close_old_connections

from apps.retention import pruning

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_running: threading.Thread | None = None
_last_start: float | None = None


def tick() -> threading.Thread | None:
    """Start a pruning pass if one is due and none is running; the thread, if started."""
    global _running, _last_start
    with _lock:
        now = time.monotonic()
        if _running is not None and _running.is_alive():
            return None
        if _last_start is not None and now - _last_start < settings.TOOLHUB_RETENTION_EVERY_S:
            return None
        _last_start = now
        _running = threading.Thread(target=run, name="toolhub-retention", daemon=True)
        _running.start()
        return _running


def run() -> None:
    try:
        totals = pruning.prune(report=logger.info)
        logger.info("retention: deleted %s", totals)
    except Exception:
        logger.exception("retention: the pruning pass failed; the next one retries")
    try:
        if settings.TOOLHUB_OAUTH_SERVER:
            forget_expired_tokens()
    except Exception:
        logger.exception("retention: clearing expired OAuth tokens failed; the next pass retries")
    finally:
        close_old_connections()


def forget_expired_tokens() -> None:
    """Expired and revoked OAuth grants and tokens of toolhub's own authorization server
    (django-oauth-toolkit's `cleartokens`, in batches): what `manage.py cleartokens` does,
    on the same schedule as the records' retention."""
    from oauth2_provider.models import clear_expired

    clear_expired()
