"""Durable background work for approvals (Django Tasks, database backend).

Tasks take ids, not objects, and check state before acting, so running one
twice is harmless: an approved call is claimed (approved -> executing) in the
transaction that records its start, and a claimed call is never run again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db import transaction
from django.tasks import task
from django.utils import timezone

from apps.approvals import wake  # noqa: F401  (wakes workers on every enqueue)

if TYPE_CHECKING:
    from apps.approvals.models import ApprovalRequest
    from apps.invocations import statements
    from apps.invocations.models import InvocationRecord

logger = logging.getLogger(__name__)

# An approved call still unclaimed after this long lost its queue entry (a worker
# died holding it): the sweeper enqueues it again.
ORPHAN_AFTER = timedelta(seconds=60)
# A worker claims several entries at once (apps.approvals.worker.CLAIM_BATCH). An
# approved call whose entry was claimed longer ago than this and has not started (the
# worker died holding its batch) is enqueued again without waiting for ORPHAN_AFTER.
# Safe even when the worker is only slow: the call's own claim lets one run it.
LEASE = timedelta(seconds=10)
# A queue entry for anything but an approved call (a notification) still RUNNING
# after this long belongs to a dead worker.
ENTRY_STALE_AFTER = timedelta(minutes=10)


@task()
def run_approved_call(approval_id: str) -> str:
    return run_approved_calls([approval_id])[approval_id]


def run_approved_calls(
    approval_ids: list[str],
    go_on: Callable[[], bool] = lambda: True,
    hand_on: Callable[[list[str]], None] | None = None,
) -> dict[str, str]:
    """Run a worker's batch of approved calls, one after another; the outcome per id.
    Stops before the next call once `go_on()` is false (a worker asked to stop): the
    calls left out have no outcome. A call whose tool is still running after QUICK_S
    (runner.resume's `on_linger`) hands the calls after it to `hand_on` (the worker puts
    their entries back for other workers) rather than hold them behind a slow tool; they
    have no outcome here either.

    One query reads every approval of the batch, and one statement per outcome writes
    the approvals' final states at the end (issue 13: per-call statements). Each call is
    still claimed (approved -> executing) in the transaction that records its start,
    after its own re-checks: a cancel that lands before that claim wins, and of two
    workers holding entries for one call exactly one runs it. Consecutive calls of tools
    that never wait are re-checked, claimed and started together on PostgreSQL (_together,
    runner.resume_together), then run one after the other. A worker killed after its
    calls' records closed leaves them `executing`; settle_interrupted makes them final."""
    from apps.approvals.models import ApprovalRequest, ApprovalStatus
    from apps.invocations import runner, statements

    # Only the record is joined. Not the tool: the re-checks look it up themselves (from
    # the catalog's cache), and its schemas are the largest thing a join here would
    # decode. Not the tenant and the requesting user: each call takes them as of the
    # epoch its checks are answered at (runner.resume, callers.requester), and joining
    # them was about a third of this read's time (issue 13).
    approvals = {
        str(approval.pk): approval
        for approval in ApprovalRequest.objects.select_related("invocation")
        .filter(pk__in=approval_ids)
        .order_by()  # into a dict: the model's ordering would only add a sort
    }
    outcomes: dict[str, str] = {}
    finished: dict[str, list[str]] = {}
    handed_on = False

    def linger(rest: list[str]) -> Callable[[], None] | None:
        def on_linger() -> None:
            nonlocal handed_on
            if hand_on is not None and not handed_on:
                handed_on = True
                hand_on(rest)

        return on_linger if rest and hand_on is not None else None

    def ended(approval: ApprovalRequest, record: InvocationRecord | None) -> None:
        if record is None:
            approval.refresh_from_db(fields=["status"])
            outcomes[str(approval.pk)] = str(approval.status)
            return
        approval.status = ApprovalStatus.SUCCEEDED if record.ok else ApprovalStatus.FAILED
        outcomes[str(approval.pk)] = str(approval.status)
        finished.setdefault(approval.status, []).append(str(approval.pk))

    # Each call's end is written in the transaction that starts the next (runner.Closing).
    closing = runner.Closing()
    together = _together(approval_ids, approvals)
    try:
        for index, approval_id in enumerate(approval_ids):
            if not go_on() or handed_on:
                break
            if approval_id in outcomes:
                continue  # started together with an earlier one
            approval = approvals.get(approval_id)
            if approval is None or approval.status != ApprovalStatus.APPROVED:
                outcomes[approval_id] = approval.status if approval else "missing"
                continue
            group = together.get(approval_id, [])
            if len(group) > 1:
                records = runner.resume_together(
                    [approvals[pk] for pk in group],
                    [_claimer(approvals[pk]) for pk in group],
                    closing,
                )
                if records is not None:
                    for pk, record in zip(group, records, strict=True):
                        ended(approvals[pk], record)
                    continue
            record = runner.resume(
                approval,
                _claimer(approval),
                on_linger=linger(approval_ids[index + 1 :]),
                closing=closing,
            )
            ended(approval, record)
    finally:
        closing.flush()
    for status, ids in finished.items():
        statements.update_rows(ApprovalRequest, ids, {"status": status})
    return outcomes


def _together(
    approval_ids: list[str], approvals: dict[str, ApprovalRequest]
) -> dict[str, list[str]]:
    """The runs of consecutive approved calls of tools that never wait (runner.
    resume_together), by their first id, on PostgreSQL only: they start in one
    statement. Nothing can hold such a call, so none holds the others of its run."""
    from apps.approvals.models import ApprovalStatus
    from apps.invocations import combined, runner

    runs: dict[str, list[str]] = {}
    if not combined.available():
        return runs
    current: list[str] = []
    for approval_id in [*approval_ids, ""]:  # "": the end closes the last run
        approval = approvals.get(approval_id)
        if (
            approval is not None
            and approval.status == ApprovalStatus.APPROVED
            and approval_id not in current  # one claim per row in a statement
            and runner.runs_inline(approval.tool_id)
        ):
            current.append(approval_id)
            continue
        if len(current) > 1:
            runs[current[0]] = current
        current = []
    return runs


def _claimer(approval: ApprovalRequest) -> statements.Guarded:
    """approved -> executing, in the transaction that records the call's start: of two
    workers holding entries for one call, exactly one gets it; a cancel that came first
    wins. A statement built once (issue 13), which PostgreSQL sends inside the start's
    own statement (apps.invocations.combined)."""
    from apps.approvals.models import ApprovalStatus
    from apps.invocations import statements

    return statements.Guarded(
        approval,
        {"status": ApprovalStatus.EXECUTING, "claimed_at": timezone.now()},
        only_if={"status": ApprovalStatus.APPROVED},
    )


@task()
def notify_pending(approval_id: str) -> int:
    from apps.approvals import notify
    from apps.approvals.models import ApprovalRequest

    approval = (
        ApprovalRequest.objects.select_related("tool", "tenant").filter(pk=approval_id).first()
    )
    if approval is None:
        return 0
    return notify.send_pending(approval)


@task()
def deliver_webhook(delivery_id: str) -> int:
    """Another attempt at a webhook delivery that failed in a way that may pass."""
    from apps.approvals import webhooks
    from apps.approvals.models import DeliveryStatus, WebhookDelivery

    delivery = (
        WebhookDelivery.objects.select_related("approval__tool", "approval__tenant", "webhook")
        .filter(pk=delivery_id, status=DeliveryStatus.PENDING)
        .first()
    )
    if delivery is None:  # delivered, failed or dropped already; or pruned with its call
        return 0
    return webhooks.attempt(delivery)


def sweep() -> dict[str, int]:
    """Expire overdue requests, re-enqueue approved calls whose queue entry was lost,
    settle calls whose lease ran out (runner.settle_lapsed_calls) or whose worker died
    while running them, count the calls that ended (and
    repair their missing results), erase the session keys of expired stream tickets, link
    any audit entries left pending by the version 1 triggers (none since audit/0003),
    and delete forgotten idempotency keys.

    Every read goes through an index that holds only the rows needing work (pending,
    approved, executing, running, RUNNING entries, unfolded ends, tickets holding a
    session), so a pass with nothing to do reads the same few rows at ten records or ten
    million (issue 45; tests/invocations/test_flat_cost.py counts them)."""
    from django.tasks import TaskResultStatus
    from django_tasks_db.models import DBTaskResult

    from apps.approvals import decisions
    from apps.approvals.models import ApprovalRequest, ApprovalStatus
    from apps.audit import chain
    from apps.invocations import ledger, rollups, runner
    from apps.invocations.models import StreamTicket

    expired = sum(
        decisions.expire_if_overdue(pk)
        # Unordered (as below): newest first, a planner may walk approvals_newest_idx.
        for pk in ApprovalRequest.objects.overdue().order_by().values_list("pk", flat=True)[:500]
    )

    now = timezone.now()
    orphaned: list[Any] = []
    approved = list(
        ApprovalRequest.objects.filter(status=ApprovalStatus.APPROVED, decided_at__lte=now - LEASE)
        .order_by()
        .values_list("pk", "decided_at")[:500]
    )
    if approved:  # the queue's entries are read only when some call may have lost its own
        entries = DBTaskResult.objects.filter(task_path=run_approved_call.module_path)
        waiting = {
            entry["args"][0]
            for entry in entries.filter(status=TaskResultStatus.READY).values_list(
                "args_kwargs", flat=True
            )
        }
        # Claimed within the lease: its worker is taken to be alive and about to run it.
        leased = {
            entry["args"][0]
            for entry in entries.filter(
                status=TaskResultStatus.RUNNING, started_at__gt=now - LEASE
            ).values_list("args_kwargs", flat=True)
        }
        orphaned = [
            pk
            for pk, decided_at in approved
            if str(pk) not in waiting
            and (str(pk) not in leased or decided_at is None or decided_at <= now - ORPHAN_AFTER)
        ]
    for pk in orphaned:
        logger.warning("re-enqueueing approved call %s whose queue entry was lost", pk)
        run_approved_call.enqueue(str(pk))
    settled = runner.settle_lapsed_calls() + settle_interrupted() + settle_abandoned_records()
    repair_missing_results()
    rollups.forget_old_minutes(now)
    end_dead_entries()
    StreamTicket.objects.forget_sessions()
    chain.link_pending()
    ledger.prune()  # forgotten idempotency keys, read through their expiry index
    return {"expired": expired, "requeued": len(orphaned), "settled": settled}


# How many times an approved call whose worker died before its tool ran is put back in
# the queue (reoffer); after that it is settled `unavailable` like any other.
REOFFERS = 2


def reoffer(record: InvocationRecord) -> bool:
    """An approved call a worker started but never handed to its tool (it waited for a
    concurrency slot, `tool_pending`) whose worker died: back in the queue, the approval
    `approved` again and the record `queued`, so that the next worker runs it, once (its
    claim, approved -> executing, still lets only one). At most REOFFERS times, counted on
    the approval. Called by runner.settle_lapsed with the record locked; False (nothing
    changed) for any other call: it is settled."""
    from apps.approvals.models import ApprovalRequest, ApprovalStatus
    from apps.invocations.models import InvocationRecord, Status

    approval = (
        ApprovalRequest.objects.filter(invocation_id=record.pk, status=ApprovalStatus.EXECUTING)
        .only("pk", "reoffered")
        .first()
    )
    if not record.tool_pending or approval is None or (approval.reoffered or 0) >= REOFFERS:
        return False
    times = (approval.reoffered or 0) + 1
    ApprovalRequest.objects.filter(pk=approval.pk, status=ApprovalStatus.EXECUTING).update(
        status=ApprovalStatus.APPROVED, claimed_at=None, reoffered=times
    )
    InvocationRecord.objects.filter(pk=record.pk).update(
        status=Status.QUEUED,
        started_at=None,
        lease_expires_at=None,
        lease_owner=None,
        tool_pending=None,
    )
    run_approved_call.enqueue(str(approval.pk))  # in the caller's transaction, as a decision's
    logger.warning(
        "re-offered approved call %s (%s) to the worker queue (%d of %d): its worker stopped "
        "before the tool ran",
        record.pk,
        record.tool_ref,
        times,
        REOFFERS,
    )
    return True


def repair_missing_results() -> int:
    """Count the calls that ended since the last pass and emit tool_call_result for those
    that have none (apps.invocations.rollups.fold): every final record is checked once,
    when its end is folded, so a result lost between a record's end and its event (a
    crash, anything that bypassed the runner) is repaired, and no pass reads older calls.
    Answers how many results were emitted."""
    from apps.invocations import rollups

    return rollups.fold_all().repaired


def end_dead_entries() -> int:
    """Queue entries left RUNNING by a worker that died: an approved call's entry ends
    with its call (settle_interrupted makes that final), any other after
    ENTRY_STALE_AFTER. The work itself is never run again from here."""
    from django.tasks import TaskResultStatus
    from django_tasks_db.models import DBTaskResult

    from apps.approvals.models import ApprovalRequest, ApprovalStatus

    now = timezone.now()
    running = DBTaskResult.objects.filter(
        status=TaskResultStatus.RUNNING, started_at__lte=now - ORPHAN_AFTER
    )[:500]
    ended = 0
    for entry in running:
        if entry.task_path == run_approved_call.module_path:
            approval = ApprovalRequest.objects.filter(pk=entry.args_kwargs["args"][0]).first()
            if approval is not None and approval.status in (
                ApprovalStatus.APPROVED,
                ApprovalStatus.EXECUTING,
            ):
                continue  # its worker may still be running it; settled with the call
            succeeded = approval is not None and approval.status == ApprovalStatus.SUCCEEDED
        elif entry.started_at is not None and now - entry.started_at > ENTRY_STALE_AFTER:
            succeeded = False
        else:
            continue
        ended += DBTaskResult.objects.filter(pk=entry.pk, status=TaskResultStatus.RUNNING).update(
            status=TaskResultStatus.SUCCESSFUL if succeeded else TaskResultStatus.FAILED,
            finished_at=now,
            exception_class_path="" if succeeded else "apps.approvals.tasks.WorkerDied",
            traceback="" if succeeded else "The worker running this entry stopped.",
        )
    if ended:
        logger.warning("ended %d queue entries of workers that died", ended)
    return ended


def settle_interrupted() -> int:
    """Claimed calls (executing) whose worker died: never run again (it may have run,
    and an external side effect must not happen twice); their state is made final."""
    from apps.approvals.models import ApprovalRequest, ApprovalStatus
    from apps.invocations import runner
    from apps.invocations.models import ErrorCode, Status

    settled = 0
    executing = (
        ApprovalRequest.objects.filter(status=ApprovalStatus.EXECUTING)
        .order_by()
        .select_related("invocation", "tool", "tenant", "requested_by")[:500]
    )
    for approval in executing:
        record = approval.invocation
        if record.status in (Status.SUCCEEDED, Status.FAILED, Status.CANCELLED):
            approval.status = ApprovalStatus.SUCCEEDED if record.ok else ApprovalStatus.FAILED
        elif _stale(approval.claimed_at, approval.tool.timeout_ms):
            runner.end_held(
                approval,
                ErrorCode.EXECUTION,
                "The worker running this call stopped before it finished; it was not retried.",
            )
            approval.status = ApprovalStatus.FAILED
        else:
            continue
        approval.save(update_fields=["status"])
        settled += 1
    return settled


def settle_abandoned_records() -> int:
    """Calls that started in a process that died (never held, so no approval tracks
    them): past their timeout by a margin, they end as failed instead of `running`.
    Each is locked and read again first: one that ended meanwhile is left as it ended."""
    from apps.invocations import runner
    from apps.invocations.models import InvocationRecord, Status

    settled = 0
    # ended_at IS NULL: the partial index of unfinished calls (invocations_unfinished_idx).
    # Unordered: newest first (the model's ordering), SQLite would walk the whole history
    # by invocations_newest_idx instead (tests/invocations/test_flat_cost.py).
    candidates = (
        InvocationRecord.objects.filter(
            ended_at__isnull=True,
            status=Status.RUNNING,
            started_at__lte=timezone.now() - ORPHAN_AFTER,
            approval__isnull=True,
        )
        .order_by()
        .select_related("tool", "tenant")[:500]
    )
    for record in candidates:
        timeout_ms = record.tool.timeout_ms if record.tool else 600_000
        if not _stale(record.started_at, timeout_ms):
            continue
        with transaction.atomic():
            still = (
                InvocationRecord.objects.select_for_update()
                .filter(pk=record.pk, status=Status.RUNNING)
                .exists()
            )
            if still:
                runner.abandon(record, "The process running this call stopped before it finished.")
                settled += 1
    return settled


def _stale(claimed_at: datetime | None, timeout_ms: int) -> bool:
    if claimed_at is None:
        return False
    return timezone.now() - claimed_at > timedelta(milliseconds=timeout_ms) + ORPHAN_AFTER
