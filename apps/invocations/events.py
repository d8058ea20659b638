"""Run events: persisted with a per-run sequence number, then pushed to the channel layer.

Every event goes through `emit`, from web and worker processes alike. The row is
written first and the push happens after commit, so a subscriber replaying from
the database and one listening live see the same events in the same order.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from datetime import datetime
from typing import Any, Literal, NotRequired, TypedDict

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction
from django.utils import timezone

from apps.invocations.models import Run, RunEvent
from apps.tenants.models import Tenant

logger = logging.getLogger(__name__)

EVENT_VERSION = 1
EventType = Literal[
    "tool_call_start",
    "tool_call_result",
    "approval_required",
    "approval_decided",
]


class EventMessage(TypedDict):
    v: int
    seq: int
    type: EventType
    runId: str
    toolCallId: str
    toolId: str
    at: str
    args: NotRequired[Any]
    ok: NotRequired[bool]
    result: NotRequired[Any]
    errorCode: NotRequired[str]
    safeMessage: NotRequired[str]
    retryAfterMs: NotRequired[int]
    durationMs: NotRequired[int]
    invocationId: NotRequired[str]
    approvalId: NotRequired[str]
    effect: NotRequired[str]
    consequenceLevel: NotRequired[str]
    decision: NotRequired[str]
    decidedBy: NotRequired[str | None]
    reason: NotRequired[str]
    expiresAt: NotRequired[str]
    argsEdited: NotRequired[bool]


def run_group(tenant_id: int, run_id: str) -> str:
    """Channel-layer group for one run (group names allow only a few characters)."""
    digest = hashlib.sha256(f"{tenant_id}/{run_id}".encode()).hexdigest()[:40]
    return f"run.{digest}"


def tenant_group(tenant_id: int) -> str:
    return f"tenant.{tenant_id}"


def emit(
    tenant: Tenant,
    run_id: str,
    type: EventType,
    *,
    tool_call_id: str,
    tool_id: str,
    at: datetime | None = None,
    **fields: Any,
) -> EventMessage:
    at = at or timezone.now()
    # Inside the caller's transaction (the runner's record and its event) no savepoint of
    # its own: an error rolls the whole transaction back anyway (issue 13: round trips).
    with transaction.atomic(savepoint=False):
        seq = Run.objects.next_seq(tenant, run_id)
        message: EventMessage = {
            "v": EVENT_VERSION,
            "seq": seq,
            "type": type,
            "runId": run_id,
            "toolCallId": tool_call_id,
            "toolId": tool_id,
            "at": at.isoformat().replace("+00:00", "Z"),
            **fields,  # type: ignore[typeddict-item]
        }
        RunEvent.objects.create(
            tenant=tenant,
            run_id=run_id,
            seq=seq,
            type=type,
            tool_call_id=tool_call_id,
            tool_id=tool_id,
            message=message,
            at=at,
        )
        transaction.on_commit(lambda: _push(tenant.pk, run_id, message))
    return message


# The event loop of the ASGI server in this process, remembered by the stream
# consumers. Pushes from plain threads (the embedded worker) are handed to it:
# the in-memory channel layer's queues belong to that loop and are not thread-safe.
_server_loop: asyncio.AbstractEventLoop | None = None


def remember_server_loop() -> None:
    global _server_loop
    _server_loop = asyncio.get_running_loop()


# Sends scheduled on a loop from sync code running on it, kept until done (no GC mid-send).
_scheduled: set[asyncio.Task[None]] = set()


def _group_send(layer: Any, group: str, envelope: dict[str, Any]) -> None:
    loop = _server_loop
    try:
        running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is not None:
        # Sync code called from a coroutine (async_to_sync cannot run there): the send
        # becomes a task of that loop.
        task = running.create_task(layer.group_send(group, envelope))
        _scheduled.add(task)
        task.add_done_callback(_scheduled.discard)
    elif loop is not None and loop.is_running():
        asyncio.run_coroutine_threadsafe(layer.group_send(group, envelope), loop).result(timeout=10)
    else:
        async_to_sync(layer.group_send)(group, envelope)


def _push(tenant_id: int, run_id: str, message: EventMessage) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        _group_send(layer, run_group(tenant_id, run_id), {"type": "run.event", "event": message})
        if message["type"].startswith("approval_"):
            # Operators follow approvals across runs on their tenant's stream.
            _group_send(
                layer, tenant_group(tenant_id), {"type": "approval.event", "event": message}
            )
    except Exception:
        # The event is already persisted: a subscriber that missed the push
        # catches up by replaying after its last sequence number.
        logger.exception("could not push event %s#%s to the channel layer", run_id, message["seq"])
