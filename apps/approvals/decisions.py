"""Deciding held calls: approve (optionally with edited args), reject, expire, cancel.

Each operation locks the approval row inside a transaction and re-reads its
status, so exactly one decision wins; the losers get AlreadyDecided (HTTP 409).
An approval is bound to a hash of tool, args and connection; edited args are
validated and re-checked by policy before they can be approved, and the runner
refuses to run anything whose hash differs from the approved one.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from typing import Any

from django.contrib.auth.models import User
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import transaction
from django.utils import timezone
from pydantic import ValidationError

from apps.approvals import tasks
from apps.approvals.models import ApprovalRequest, ApprovalStatus, Vote
from apps.invocations import combined, events, runner, statements
from apps.invocations.models import ErrorCode, InvocationRecord, Status
from apps.invocations.requests import MAX_ARGS_BYTES
from apps.policies.policy import Evaluator
from apps.receipts import signing as receipts
from apps.tenants.callers import Caller
from apps.tools import sources
from apps.tools.permissions import can_decide


class DecisionError(Exception):
    status_code = 400


class NotFound(DecisionError):
    status_code = 404


class NotAllowed(DecisionError):
    status_code = 403


class AlreadyDecided(DecisionError):
    status_code = 409


class InvalidEdit(DecisionError):
    status_code = 400


def _locked(approval_id: Any, user: User | None, *, with_call: bool = True) -> ApprovalRequest:
    """The approval, locked, with its tool and tenant, and with its call's record and
    requester unless `with_call` is False (an approval writes the record's status alone)."""
    # of=("self",): lock the approval row only. Without it PostgreSQL also locks the
    # joined tenant, tool, record and user rows, and a concurrent event insert (which
    # key-share-locks the tenant) deadlocks with the decision's own event on the run.
    # On SQLite, IMMEDIATE transactions serialize writers, with the same outcome.
    related = ("tool", "tenant", "invocation", "requested_by") if with_call else ("tool", "tenant")
    query = ApprovalRequest.objects.select_for_update(of=("self",)).select_related(*related)
    if user is not None:
        query = query.filter(pk__in=ApprovalRequest.objects.visible_to(user).values("pk"))
    approval = query.filter(pk=approval_id).first()
    if approval is None:
        raise NotFound("No such approval request in your tenants.")
    return approval


def expire_if_overdue(approval_id: Any) -> bool:
    """Move an overdue pending request to expired (never executed); True if it did (the
    sweeper's pass).

    Whether it is overdue is read first without a lock (on SQLite a locking read is a
    write transaction); an overdue one is checked again under the lock."""
    try:
        overdue = ApprovalRequest.objects.filter(
            pk=approval_id, status=ApprovalStatus.PENDING, expires_at__lte=timezone.now()
        ).exists()
    except (DjangoValidationError, ValueError):
        return False  # not an id: the caller reports it
    if not overdue:
        return False
    with transaction.atomic():
        return _expired(_locked(approval_id, None))


def _expired(approval: ApprovalRequest) -> bool:
    """A locked request still pending past its expiry is expired now, its call ended (it
    never runs); True if it was."""
    if approval.status != ApprovalStatus.PENDING or not approval.is_expired:
        return False
    _close(approval, ApprovalStatus.EXPIRED, None, "The approval request expired.")
    runner.end_held(
        approval,
        ErrorCode.APPROVAL_EXPIRED,
        "Nobody decided on this call in time; it did not run.",
    )
    return True


def decide(
    approval_id: Any,
    user: User,
    decision: str,
    reason: str = "",
    args: dict[str, Any] | None = None,
) -> ApprovalRequest:
    """Approve or reject; `args` approves edited arguments. First decision wins.

    An overdue request is expired instead: the expiry (and its call's end) commits and the
    decision fails with AlreadyDecided, so a late approval never runs the call. The
    answer is the request as committed, with `approvals_given` counted."""
    with transaction.atomic():
        # An approval (the usual decision) needs none of its call's record but its key.
        approval = _locked(approval_id, user, with_call=decision != "approve")
        expired = _expired(approval)
        if not expired:
            _decide_locked(approval, user, decision, reason, args)
    if expired:  # raised once the expiry has committed
        raise AlreadyDecided(f"This request is already {approval.status}.")
    return approval


def expire_if_overdue_safely(approval_id: Any) -> None:
    """Expire the request if it is overdue (a page about it shows it as it is); an unknown
    id is reported by whoever asked, with the user's view of it."""
    with contextlib.suppress(NotFound):
        expire_if_overdue(approval_id)


def _decide_locked(
    approval: ApprovalRequest,
    user: User,
    decision: str,
    reason: str,
    args: dict[str, Any] | None,
) -> None:
    if approval.status != ApprovalStatus.PENDING:
        raise AlreadyDecided(f"This request is already {approval.status}.")
    if not can_decide(user, approval.tool, approval.tenant_id):
        raise NotAllowed(f"You may not decide calls of {approval.tool_id} (decide_approval).")
    if approval.four_eyes and _is_requester(user, approval):
        raise NotAllowed("Four-eyes rule: you cannot approve or reject your own call.")
    if decision == "reject":
        _reject(approval, user, reason)
    elif decision == "approve":
        _approve(approval, user, reason, args)
    else:
        raise InvalidEdit("decision must be approve or reject")


def cancel(approval_id: Any, *, by: str, user: User | None) -> ApprovalRequest:
    """Cancel a call that has not started: pending or approved-but-queued. An overdue
    pending one is expired instead (committed; the cancel fails with AlreadyDecided)."""
    with transaction.atomic():
        approval = _locked(approval_id, user)
        expired = _expired(approval)
        if not expired:
            if approval.status not in (ApprovalStatus.PENDING, ApprovalStatus.APPROVED):
                raise AlreadyDecided(f"This call cannot be cancelled: it is {approval.status}.")
            _close(approval, ApprovalStatus.CANCELLED, user, f"Cancelled by {by}.", decided_by=by)
            runner.end_held(approval, ErrorCode.CANCELLED, f"The call was cancelled by {by}.")
    if expired:
        raise AlreadyDecided(f"This call cannot be cancelled: it is {approval.status}.")
    return approval


def _is_requester(user: User, approval: ApprovalRequest) -> bool:
    return (
        user.pk == approval.requested_by_id or approval.principal == f"user:{user.get_username()}"
    )


def _vote(approval: ApprovalRequest, user: User, decision: str, reason: str) -> Vote:
    """This operator's vote on the approval's arguments as they are now (not saved)."""
    return Vote(
        approval=approval,
        user=user,
        decision=decision,
        bound_hash=approval.bound_hash,
        reason=reason,
    )


def _reject(approval: ApprovalRequest, user: User, reason: str) -> None:
    reason = reason.strip() or "Rejected by an operator."
    vote = _vote(approval, user, Vote.Decision.REJECT, reason)
    if approval.approvals_required > 1:  # earlier approvals toward the quorum stay counted
        vote.save()
        _close(approval, ApprovalStatus.REJECTED, user, reason)
        approval.approvals_given = approval.votes.filter(decision=Vote.Decision.APPROVE).count()
    else:  # one approval required: nobody voted before (any vote decides), this is the only
        _close(approval, ApprovalStatus.REJECTED, user, reason, vote=vote)
        approval.approvals_given = 0
    # The reason reaches the caller and the model as the tool result's safeMessage.
    runner.end_held(approval, ErrorCode.APPROVAL_REJECTED, reason[:1000])


def _approve(
    approval: ApprovalRequest, user: User, reason: str, args: dict[str, Any] | None
) -> None:
    if args is not None and args != approval.args:
        _apply_edit(approval, args)
    vote = _vote(approval, user, Vote.Decision.APPROVE, reason)
    # What an approval writes of its call's record: its status.
    record = InvocationRecord(pk=approval.invocation_id)
    record._state.adding, record._state.db = False, approval._state.db
    if approval.approvals_required == 1:
        # The usual case: nobody voted before (any vote decides), and this vote is the
        # quorum. The vote is written with the decision's other rows (_close).
        record.status = Status.QUEUED
        _close(approval, ApprovalStatus.APPROVED, user, reason.strip(), vote=vote, queued=record)
        approval.approvals_given = 1
    else:
        # The approval's row is locked: one decision of this operator at a time, so an
        # update that finds no vote can insert it without update_or_create's savepoints.
        written = {"decision": vote.decision, "bound_hash": vote.bound_hash, "reason": reason}
        if not Vote.objects.filter(approval=approval, user=user).update(**written):
            vote.save()
        given = approval.votes.filter(
            decision=Vote.Decision.APPROVE, bound_hash=approval.bound_hash
        ).count()
        approval.approvals_given = given
        if given < approval.approvals_required:
            approval.save()
            return  # the quorum is not reached yet; the request stays pending
        record.status = Status.QUEUED
        _close(approval, ApprovalStatus.APPROVED, user, reason.strip(), queued=record)
    # Same transaction as the approval: the queue entry exists iff the approval does.
    tasks.run_approved_call.enqueue(str(approval.pk))


def _apply_edit(approval: ApprovalRequest, args: dict[str, Any]) -> None:
    """Edited args: validated against the schema and re-checked by policy first."""
    registered = sources.get_tool(approval.tool_id)
    if registered is None:
        raise InvalidEdit("The tool is no longer available.")
    size = len(json.dumps(args, separators=(",", ":"), ensure_ascii=False).encode())
    if size > MAX_ARGS_BYTES:
        raise InvalidEdit(f"The edited arguments are {size} bytes; the limit is {MAX_ARGS_BYTES}.")
    try:
        params = registered.contract.params.model_validate_json(json.dumps(args), strict=True)
    except ValidationError as exc:
        raise InvalidEdit(runner.explain_validation(exc)) from None
    validated = params.model_dump(mode="json")
    caller = Caller(
        tenant=approval.tenant, principal=approval.principal, user=approval.requested_by
    )
    verdict = Evaluator(caller.tenant, caller.principal, caller.user).decide(
        approval.tool, args=validated, run_id=approval.run_id
    )
    if not verdict.allowed:
        raise InvalidEdit(f"Policy refuses the edited arguments: {verdict.reason}")
    approval.args_diff = diff(approval.original_args, validated)
    approval.args = validated
    approval.bound_hash = runner.request_hash(approval.tool_id, validated, approval.connection_id)


def _close(
    approval: ApprovalRequest,
    status: ApprovalStatus,
    user: User | None,
    reason: str,
    decided_by: str | None = None,
    *,
    vote: Vote | None = None,
    queued: InvocationRecord | None = None,
) -> None:
    """Write the decision: the request's outcome, its signed receipt, its
    `approval_decided` event, and with them `vote` (an unsaved vote that is the request's
    only one) and the `queued` record's status. On PostgreSQL one statement
    (apps.invocations.combined), else the statements one by one."""
    approval.status = status
    approval.decided_by = user
    approval.decided_at = timezone.now()
    approval.decision_reason = reason[:1000]
    who = decided_by or (user.get_username() if user else None)
    # issue 48: who voted what, signed
    receipt = receipts.decision_receipt(approval, who, None if vote is None else [vote])
    event = events.Event(
        "approval_decided",
        approval.tool_call_id,
        approval.tool_id,
        {
            "approvalId": str(approval.pk),
            "decision": _DECISION_WORD[status],
            "decidedBy": who,
            "reason": approval.decision_reason,
            "argsEdited": bool(approval.args_diff),
        },
    )
    inserts: list[Any] = [vote] if vote is not None else []
    updates: list[tuple[Any, tuple[str, ...]]] = [(approval, CLOSED_FIELDS)]
    if queued is not None:
        updates.append((queued, ("status",)))
    using = approval._state.db or "default"
    if combined.available(using) and combined.record(
        using,
        [*inserts, receipt],
        updates,
        [combined.Pending(approval.tenant, approval.run_id, event, needs_claim=False)],
    ):
        return
    if inserts:
        statements.insert(inserts, using)
    for row, fields in updates:
        statements.update(row, fields)
    statements.insert([receipt], using)
    events.emit_many(approval.tenant, approval.run_id, [event])


# What a decision writes: its outcome, and the arguments an approval may have edited.
CLOSED_FIELDS = (
    "status",
    "decided_by",
    "decided_at",
    "decision_reason",
    "args",
    "args_diff",
    "bound_hash",
)

_DECISION_WORD = {
    ApprovalStatus.APPROVED: "approve",
    ApprovalStatus.REJECTED: "reject",
    ApprovalStatus.EXPIRED: "expire",
    ApprovalStatus.CANCELLED: "cancel",
}


def diff(before: dict[str, Any], after: dict[str, Any]) -> list[dict[str, Any]]:
    """Top-level changes between two argument objects, for the record and the console."""
    changes = []
    for key in sorted(set(before) | set(after)):
        if before.get(key, _MISSING) != after.get(key, _MISSING):
            changes.append(
                {
                    "field": key,
                    "before": before.get(key),
                    "after": after.get(key),
                    "change": "added"
                    if key not in before
                    else "removed"
                    if key not in after
                    else "changed",
                }
            )
    return changes


_MISSING = object()


BULK_LIMIT = 100


@dataclass(frozen=True)
class BulkResult:
    approval_id: str
    tool_id: str
    outcome: str  # approved, rejected, waiting for more approvals, or why nothing happened
    done: bool


def decide_many(ids: list[Any], user: User, decision: str, reason: str = "") -> list[BulkResult]:
    """The console's bulk approve or reject: each request decided on its own (the first
    decision wins each, a failure stops none of the others). A high-consequence call is
    never approved in bulk: its arguments deserve their own page. No edits in bulk."""
    if decision not in ("approve", "reject"):
        raise InvalidEdit("decision must be approve or reject")
    if decision == "reject" and not reason.strip():
        raise InvalidEdit("Say why you reject them: the reason goes back to each agent.")
    if not ids or len(ids) > BULK_LIMIT:
        raise InvalidEdit(f"Choose between 1 and {BULK_LIMIT} calls.")
    results = []
    for approval_id in dict.fromkeys(str(each) for each in ids):  # each once, in order
        seen = ApprovalRequest.objects.visible_to(user).filter(pk=approval_id)
        tool_id = seen.values_list("tool_id", flat=True).first() or ""
        high = seen.filter(tool__consequence_level="high").exists()
        if decision == "approve" and high:
            results.append(
                BulkResult(approval_id, tool_id, "high consequence: review it on its page", False)
            )
            continue
        try:
            approval = decide(approval_id, user, decision, reason)
        except DecisionError as exc:
            results.append(BulkResult(approval_id, tool_id, str(exc), False))
            continue
        outcome = (
            approval.status
            if approval.status != ApprovalStatus.PENDING
            else ("waiting for more approvals")
        )
        results.append(BulkResult(approval_id, approval.tool_id, str(outcome), True))
    return results
