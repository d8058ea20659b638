"""Run events: persisted with a per-run sequence number, then pushed to the channel layer.

Every event goes through `emit`, from web and worker processes alike. The row is
written first and the push happens after commit, so a subscriber replaying from
the database and one listening live see the same events in the same order.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import threading
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Any, Literal, NotRequired, TypedDict

from asgiref.sync import SyncToAsync, async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction
from django.utils import timezone
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from apps.invocations import statements
from apps.invocations.fanout import CATCH_UP_TYPE
from apps.invocations.models import Run, RunEvent
from apps.tenants.models import Tenant

logger = logging.getLogger(__name__)

EVENT_VERSION = 1
EventType = Literal[
    "tool_call_start",
    "tool_call_retry",
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
    attempt: NotRequired[int]
    waitMs: NotRequired[int]


def run_group(tenant_id: int, run_id: str) -> str:
    """Channel-layer group for one run (group names allow only a few characters).

    The tenant is part of the hash: a run id belongs to a tenant, so the same run id in
    two tenants is two unrelated groups and no stream of one tenant hears the other's."""
    digest = hashlib.sha256(f"{tenant_id}/{run_id}".encode()).hexdigest()[:40]
    return f"run.{digest}"


def tenant_group(tenant_id: int) -> str:
    return f"tenant.{tenant_id}"


@dataclass(frozen=True)
class Event:
    """An event to emit: its type, the call it is about, and its own fields."""

    type: EventType
    tool_call_id: str
    tool_id: str
    fields: dict[str, Any]
    at: datetime | None = None


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
    messages = emit_many(tenant, run_id, [Event(type, tool_call_id, tool_id, fields, at)])
    if not messages:  # inside gathered(): numbered when the block ends
        raise RuntimeError("emit() answers the event's message: call it outside gathered()")
    return messages[0]


def emit_many(tenant: Tenant, run_id: str, batch: list[Event]) -> list[EventMessage]:
    """Persist events of one run with consecutive numbers, and push them after commit.

    Several events (a quick call's start and result) take one number allocation and
    one insert between them (issue 13). Inside `gathered()` the events are only noted
    (and the answer is empty): the block writes them all when it ends."""
    pending = _gathering.get()
    if pending is not None:
        pending.append((tenant, run_id, batch))
        return []
    return _write([(tenant, run_id, batch)])[0]


# Events noted inside gathered(), per (tenant, run, events) in the order emitted.
_gathering: ContextVar[list[tuple[Tenant, str, list[Event]]] | None] = ContextVar(
    "toolhub_gathered_events", default=None
)


def gathering() -> bool:
    """Whether events emitted now are only noted, for the enclosing gathered() block to
    write: a write of its own now would number its events before the noted ones."""
    return _gathering.get() is not None


@contextmanager
def gathered() -> Iterator[None]:
    """The events emitted in this block, whatever their runs, are numbered with one upsert
    and written with one insert when it ends without an error (a worker's transaction that
    closes one call and starts the next: issue 13). Use it inside a transaction; each
    run's events are pushed after commit in the order they were emitted."""
    if _gathering.get() is not None:  # nested: the outer block writes them
        yield
        return
    pending: list[tuple[Tenant, str, list[Event]]] = []
    token = _gathering.set(pending)
    try:
        yield
    finally:
        _gathering.reset(token)
    if pending:
        _write(pending)


def _write(batches: list[tuple[Tenant, str, list[Event]]]) -> list[list[EventMessage]]:
    """Number, insert and (after commit) push each batch's events; their messages."""
    # Inside the caller's transaction (the runner's record and its event) no savepoint of
    # its own: an error rolls the whole transaction back anyway (issue 13: round trips).
    with transaction.atomic(savepoint=False):
        counts: dict[tuple[int, str], int] = {}
        for tenant, run_id, batch in batches:
            counts[(tenant.pk, run_id)] = counts.get((tenant.pk, run_id), 0) + len(batch)
        if len(counts) == 1:
            (((tenant_id, run_id), count),) = counts.items()
            last = {(tenant_id, run_id): Run.objects.next_seq(batches[0][0], run_id, count)}
        else:
            last = Run.objects.next_seqs(counts)
        following = {key: last[key] - count + 1 for key, count in counts.items()}
        written: list[list[EventMessage]] = []
        rows = []
        for tenant, run_id, batch in batches:
            messages: list[EventMessage] = []
            for event in batch:
                seq = following[(tenant.pk, run_id)]
                following[(tenant.pk, run_id)] = seq + 1
                row = stored(tenant, run_id, event, seq)
                messages.append(row.message)
                rows.append(row)
            written.append(messages)
        statements.insert(rows)  # one statement, its text built once (issue 13)
        push_after_commit(batches, written)
    return written


def stored(tenant: Tenant, run_id: str, event: Event, seq: int) -> RunEvent:
    """The event as streamed (its message) and as stored, numbered `seq`."""
    message, at = streamed(run_id, event, seq)
    return RunEvent(
        tenant=tenant,
        run_id=run_id,
        seq=seq,
        type=event.type,
        tool_call_id=event.tool_call_id,
        tool_id=event.tool_id,
        message=message,
        at=at,
    )


def streamed(run_id: str, event: Event, seq: int) -> tuple[EventMessage, datetime]:
    """The event's message as streamed, numbered `seq`, and its time."""
    at = event.at or timezone.now()
    message: EventMessage = {
        "v": EVENT_VERSION,
        "seq": seq,
        "type": event.type,
        "runId": run_id,
        "toolCallId": event.tool_call_id,
        "toolId": event.tool_id,
        "at": at.isoformat().replace("+00:00", "Z"),
        **event.fields,  # type: ignore[typeddict-item]
    }
    return message, at


def push_after_commit(
    batches: list[tuple[Tenant, str, list[Event]]], written: list[list[EventMessage]]
) -> None:
    """Push each batch's messages once the transaction commits (now, outside one); those
    of the run held by `holding()` are held instead."""
    held = _holding.get()
    for (tenant, run_id, _), messages in zip(batches, written, strict=True):
        if messages:
            push = _hold if held == (tenant.pk, run_id) else _push_all
            transaction.on_commit(partial(push, tenant.pk, run_id, messages))


# Committed events whose push waits, per (tenant id, run id): a call recorded before it
# runs holds its tool_call_start until its tool_call_result goes, in one message with it,
# or until its tool outlasts QUICK_S (runner.execute). One push and one wake-up of the
# loop fewer per call (issue 13). Any push of the run in this process takes them along
# first, so the run's events still leave this process in the order they are numbered.
_held: dict[tuple[int, str], list[EventMessage]] = {}
_held_lock = threading.Lock()
_holding: ContextVar[tuple[int, str] | None] = ContextVar("toolhub_held_pushes", default=None)


@contextmanager
def holding(tenant_id: int, run_id: str) -> Iterator[None]:
    """The run's events committed inside this block are held, not pushed, until the run's
    next push in this process or `release()`. For a block outside any transaction (each
    commit inside it is its own); the caller releases, whatever happens after."""
    token = _holding.set((tenant_id, run_id))
    try:
        yield
    finally:
        _holding.reset(token)


def _hold(tenant_id: int, run_id: str, messages: list[EventMessage]) -> None:
    with _held_lock:
        _held.setdefault((tenant_id, run_id), []).extend(messages)


def _take_held(tenant_id: int, run_id: str) -> list[EventMessage]:
    if not _held:  # nothing held in this process: no lock to take
        return []
    with _held_lock:
        return _held.pop((tenant_id, run_id), [])


def release(tenant_id: int, run_id: str) -> None:
    """Push the run's held events now (none held: nothing to do)."""
    held = _take_held(tenant_id, run_id)
    if held:
        _push(tenant_id, run_id, held)


# The event loop of the ASGI server in this process, remembered by every HTTP request
# and stream (toolhub/asgi.py, the consumers) and by the worker's push loop. Pushes from
# plain threads (views, the embedded worker) are handed to it: the in-memory channel
# layer's queues belong to that loop and are not thread-safe.
_server_loop: asyncio.AbstractEventLoop | None = None


def remember_server_loop() -> None:
    global _server_loop
    _server_loop = asyncio.get_running_loop()


OUTBOX_LIMIT = 10_000  # pushes waiting for the layer; past it they are dropped (and logged)
SEND_TIMEOUT_S = 5.0  # one send; a layer slower than this is treated as failing
SEND_BATCH = 64  # pushes waiting behind each other sent together, where the layer can
# Under sustained pushes (the last send ended less than this ago) the next one waits this
# long for more to join it, where the layer sends several in one round trip: a worker's
# pushes otherwise left one or two at a time, each paying Redis's round trip and its
# client's work (about a fifth of a queued call's CPU in its worker: issue 13). A push
# after a quiet spell leaves at once.
COALESCE_S = 0.002
# After a send failed, the next attempt waits this long, doubling up to RETRY_MAX_S.
RETRY_MIN_S, RETRY_MAX_S = 0.25, 2.0
# The message that tells a group's feeds their subscribers may have missed pushes
# (apps/invocations/fanout.py): each re-reads what it can from the database.
CATCH_UP = {"type": CATCH_UP_TYPE}


def _layer_down(error: BaseException) -> bool:
    """A failure of the layer itself (Redis unreachable, restarting, too slow), which a
    later attempt may not meet; anything else is a bad message, sent again in vain."""
    return isinstance(error, OSError | RedisConnectionError | RedisTimeoutError)


class Outbox:
    """Pushes handed to one loop, sent in the order they were handed, by one task.

    A view or worker thread does not wait for the layer (issue 13: the wait was a round trip
    to the loop, twice per call): the event is already committed, and the order of sends is
    the order of commits in this process (a run's held events leave before its next ones:
    holding()), which a subscriber's sequence check relies on. Pushes waiting behind each
    other leave together where the layer can send several at once, and under sustained
    pushes a push waits COALESCE_S for others to share its round trip. A send that fails or
    takes over SEND_TIMEOUT_S drops the sends waiting behind it, and a queue past
    OUTBOX_LIMIT drops new ones: the events are in the database. A subscriber sees the gap
    at the group's next event, but a run's last events have none after them, so every group
    whose pushes were lost is remembered and sent CATCH_UP, retried until the layer takes
    it: its feeds, in every process, then have their subscribers re-read the database.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.pending: deque[tuple[Any, str, dict[str, Any]]] = deque()
        self.missed: dict[str, Any] = {}  # group -> layer: owed a CATCH_UP
        self.sender: asyncio.Task[None] | None = None
        self.dropped = 0
        self.retry_s = RETRY_MIN_S
        # Handed from other threads, not yet taken by the loop; one wake-up takes them all.
        self._handed: deque[tuple[Any, str, dict[str, Any]]] = deque()
        self._handed_lock = threading.Lock()
        # A take of what was handed is coming (a wake-up is queued, or the sender is
        # gathering and takes it when its wait ends): a hand needs no wake-up of its own.
        self._waking = False
        self.alone = 0  # how many of the next pushes go alone (after a batch failed)
        self.last_sent = -math.inf  # when the last send succeeded (the loop's clock)

    def hand(self, layer: Any, group: str, envelope: dict[str, Any]) -> None:
        """From any thread: queue the send on the loop, without waiting for it. Sends
        handed before the loop took the earlier ones share their wake-up (a write to the
        loop's self-pipe, about a tenth of a queued call's time in its worker: issue 13)."""
        with self._handed_lock:
            self._handed.append((layer, group, envelope))
            if self._waking:
                return
            self._waking = True
        try:
            self.loop.call_soon_threadsafe(self._take_handed)
        except BaseException:  # a closed loop: nothing will take them
            with self._handed_lock:
                self._waking = False
                self._handed.clear()
            raise

    def _take_handed(self) -> None:
        """On the loop: queue what was handed, in the order it was handed."""
        with self._handed_lock:
            handed, self._handed = self._handed, deque()
            self._waking = False
        for layer, group, envelope in handed:
            self.put(layer, group, envelope)

    def put(self, layer: Any, group: str, envelope: dict[str, Any]) -> None:
        """On the loop."""
        if len(self.pending) >= OUTBOX_LIMIT:
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 1000 == 0:
                logger.error("channel layer push backlog full: %s pushes dropped", self.dropped)
            self._owe(layer, group)
            return
        self.pending.append((layer, group, envelope))
        self._start()

    def _start(self) -> None:
        if self.sender is None or self.sender.done():
            self.sender = self.loop.create_task(self._send_all())

    def _owe(self, layer: Any, group: str) -> None:
        if group in self.missed or len(self.missed) < OUTBOX_LIMIT:
            self.missed[group] = layer
        else:
            logger.error("channel layer failing: %s may wait for its next event", group)

    async def _send_all(self) -> None:
        while self.pending or self.missed:
            if self.pending:
                if self._coalescing():
                    await self._gather()
                batch = self._next_batch()
                error = await self._send_many(batch)
                if error is None:
                    continue
                if len(batch) > 1 and not _layer_down(error):
                    # One of them is at fault, not the layer: each goes again alone, so
                    # that only that one is lost.
                    self.pending.extendleft(reversed(batch))
                    self.alone = len(batch)
                    continue
                layer, group, envelope = batch[0]
                event: dict[str, Any] = envelope.get("event") or next(
                    iter(envelope.get("events", [])), {}
                )
                logger.error(
                    "could not push event %s#%s%s to the channel layer: %s",
                    event.get("runId"),
                    event.get("seq"),
                    f" and {len(batch) - 1} more pushes" if len(batch) > 1 else "",
                    type(error).__name__,
                    exc_info=error,
                )
                if not _layer_down(error):
                    continue  # this message is at fault, not the layer: the next ones go
                # A layer that fails or hangs (Redis restarting) would hold every later
                # push behind this one: the waiting ones are dropped, and their groups
                # are owed a catch-up once the layer answers again.
                for failed_layer, failed_group, _ in batch:
                    self._owe(failed_layer, failed_group)
                if self.pending:
                    logger.error(
                        "channel layer failing: %s waiting pushes dropped (their streams "
                        "catch up from the database once it answers)",
                        len(self.pending),
                    )
                    self.dropped += len(self.pending)
                    for waiting_layer, waiting_group, _ in self.pending:
                        self._owe(waiting_layer, waiting_group)
                    self.pending.clear()
                await self._back_off()
                continue
            group, layer = next(iter(self.missed.items()))
            error = await self._send(layer, group, CATCH_UP)
            if error is None:
                del self.missed[group]
            elif _layer_down(error):
                await self._back_off()
            else:
                logger.error("could not send a catch-up to %s", group, exc_info=error)
                del self.missed[group]

    async def _gather(self) -> None:
        """Wait COALESCE_S, then take what other threads handed meanwhile (without a
        wake-up each)."""
        with self._handed_lock:
            self._waking = True
        try:
            await asyncio.sleep(COALESCE_S)
        finally:
            self._take_handed()

    def _coalescing(self) -> bool:
        """Whether the next push should wait COALESCE_S for others: sends are sustained,
        the layer takes several at once, and a batch is not already full."""
        return (
            not self.alone
            and len(self.pending) < SEND_BATCH
            and self.loop.time() - self.last_sent < COALESCE_S
            and hasattr(self.pending[0][0], "group_send_many")
        )

    def _next_batch(self) -> list[tuple[Any, str, dict[str, Any]]]:
        """The next push, with those queued right behind it for the same layer when the
        layer sends several in one round trip
        (toolhub.layers.redis_layer.RedisLayer.group_send_many)."""
        batch = [self.pending.popleft()]
        if self.alone:
            self.alone -= 1
            return batch
        layer = batch[0][0]
        if hasattr(layer, "group_send_many"):
            while self.pending and len(batch) < SEND_BATCH and self.pending[0][0] is layer:
                batch.append(self.pending.popleft())
        return batch

    async def _send_many(self, batch: list[tuple[Any, str, dict[str, Any]]]) -> Exception | None:
        if len(batch) == 1:
            return await self._send(*batch[0])
        sends = [(group, message) for _, group, message in batch]
        try:
            await asyncio.wait_for(batch[0][0].group_send_many(sends), SEND_TIMEOUT_S)
        except Exception as error:
            return error
        self.retry_s = RETRY_MIN_S
        self.last_sent = self.loop.time()
        return None

    async def _send(self, layer: Any, group: str, message: dict[str, Any]) -> Exception | None:
        try:
            await asyncio.wait_for(layer.group_send(group, message), SEND_TIMEOUT_S)
        except Exception as error:
            return error
        self.retry_s = RETRY_MIN_S
        self.last_sent = self.loop.time()
        return None

    async def _back_off(self) -> None:
        await asyncio.sleep(self.retry_s)
        self.retry_s = min(self.retry_s * 2, RETRY_MAX_S)


_outboxes: dict[asyncio.AbstractEventLoop, Outbox] = {}
_outboxes_lock = threading.Lock()


def outbox(loop: asyncio.AbstractEventLoop) -> Outbox:
    with _outboxes_lock:
        found = _outboxes.get(loop)
        if found is None or loop.is_closed():
            found = _outboxes[loop] = Outbox(loop)
            for gone in [other for other in _outboxes if other.is_closed()]:
                del _outboxes[gone]
        return found


def _group_send(layer: Any, group: str, envelope: dict[str, Any]) -> None:
    try:
        running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is not None:
        # Sync code called from a coroutine (async_to_sync cannot run there).
        outbox(running).put(layer, group, envelope)
        return
    loop = _server_loop
    if loop is not None and loop.is_running():
        outbox(loop).hand(layer, group, envelope)
        return
    # No server loop in this process (a management command, the test client), or the
    # server's has stopped under a request still finishing (toolhub/server/draining.py keeps
    # Daphne's running until then; another server may not). In a thread that
    # sync_to_async started, async_to_sync hands the send to the loop that started it:
    # a stopped one never runs it, and the thread waited for ever. Then a loop of its own.
    came_from = getattr(SyncToAsync.threadlocal, "main_event_loop", None)
    stopped = came_from is not None and not came_from.is_running()
    async_to_sync(layer.group_send, force_new_loop=stopped)(group, envelope)


def _push_all(tenant_id: int, run_id: str, messages: list[EventMessage]) -> None:
    held = _take_held(tenant_id, run_id)
    if held:  # numbered before these (committed earlier in this process)
        messages = sorted([*held, *messages], key=lambda message: message["seq"])
    _push(tenant_id, run_id, messages)


def _push(tenant_id: int, run_id: str, messages: list[EventMessage]) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    # Events committed together (a quick call's start and result) travel as one layer
    # message: one send instead of two, and a feed hands both to each subscriber in turn,
    # so the result does not wait behind the start's whole fan-out (issue 13, goal 8).
    envelope: dict[str, Any] = (
        {"type": "run.event", "event": messages[0]}
        if len(messages) == 1
        else {"type": "run.events", "events": messages}
    )
    try:
        _group_send(layer, run_group(tenant_id, run_id), envelope)
    except Exception:  # the synchronous fallback's send, or a loop already closed
        # The events are already persisted: a subscriber that missed the push
        # catches up by replaying after its last sequence number.
        logger.exception(
            "could not push events %s#%s to the channel layer", run_id, messages[0]["seq"]
        )
    for message in messages:
        if message["type"].startswith("approval_"):
            _push_to_operators(layer, tenant_id, message)


def _push_to_operators(layer: Any, tenant_id: int, message: EventMessage) -> None:
    """Operators follow approvals across runs on their tenant's stream."""
    try:
        _group_send(layer, tenant_group(tenant_id), {"type": "approval.event", "event": message})
    except Exception:  # as in _push: the event is persisted, the stream catches up
        logger.exception(
            "could not push event %s#%s to the tenant's stream", message["runId"], message["seq"]
        )
