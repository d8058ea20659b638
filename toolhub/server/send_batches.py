"""Sends that belong together.

Code that sends one client several messages in a row (a run's feed handing a subscriber
the start and the result of a quick call, apps/invocations/fanout.py) marks the stretch
with `together()`. A transport that can join writes (Daphne's frames,
toolhub/server/daphne_frames.py) `hold`s a socket's bytes while a stretch is open and sends them
joined when it closes: one packet for the client to read instead of one per message.
Where no transport holds anything, the mark changes nothing.

The stretch is a context variable: it covers the sends of the task that opened it (an
ASGI `send` runs in its caller's task), not those of other tasks running meanwhile.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any

logger = logging.getLogger(__name__)

# What the open stretch holds: each key (a transport) with what sends its bytes.
_held: ContextVar[dict[Any, Callable[[Any], None]] | None] = ContextVar("send_batch", default=None)


@contextlib.contextmanager
def together() -> Iterator[None]:
    """Hold the sends made inside, and send each key's at the end (nested: at the outer end)."""
    if _held.get() is not None:
        yield
        return
    held: dict[Any, Callable[[Any], None]] = {}
    token = _held.set(held)
    try:
        yield
    finally:
        _held.reset(token)
        for key, send in held.items():
            try:
                send(key)
            except Exception:
                logger.exception("could not send a held batch")


def hold(key: Any, send: Callable[[Any], None]) -> bool:
    """Whether a stretch is open; if so, `send(key)` runs once when it ends."""
    held = _held.get()
    if held is None:
        return False
    held.setdefault(key, send)
    return True
