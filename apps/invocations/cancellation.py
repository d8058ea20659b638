"""Cancelling a call: held or queued calls end at once; a running one is asked to stop.

A running call's runner polls `cancel_requested` while it waits for the tool,
whichever process it runs in, and ends the call as `cancelled`; the tool's
context is marked cancelled so cooperative tools stop early.
"""

from __future__ import annotations

from apps.invocations.models import InvocationRecord, Status


class NotCancellable(Exception):
    pass


def cancel(record: InvocationRecord, *, by: str) -> InvocationRecord:
    from apps.approvals import decisions

    if record.status in (Status.PENDING_APPROVAL, Status.QUEUED):
        try:
            decisions.cancel(record.approval.pk, by=by, user=None)
        except decisions.AlreadyDecided as exc:
            # A worker may have claimed the approved call a moment ago (executing, record
            # still queued): then it is about to run, so ask it to stop like a running one.
            asked = InvocationRecord.objects.filter(
                pk=record.pk, status__in=(Status.QUEUED, Status.RUNNING)
            ).update(cancel_requested=True)
            if not asked:
                raise NotCancellable(str(exc)) from None
    elif record.status == Status.RUNNING:
        InvocationRecord.objects.filter(pk=record.pk).update(cancel_requested=True)
    else:
        raise NotCancellable(f"The call already finished ({record.status}).")
    record.refresh_from_db()
    return record
