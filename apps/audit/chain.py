"""Appending to a tenant's chain from Python (checkpoints), linking pending entries left
by the version 1 triggers (the sweeper's repair pass), and checkpoints for pruning.

The writes of records and events are linked by the triggers as they are written
(apps.audit.digests): nothing here is on a call's path. `link_pending` takes each
tenant's pending entries in the order they were journaled, locks that tenant's head row
and appends them (as version 1: their digests are); after migration 0003 there are none
unless a database from before it was restored. Two linkers on one tenant meet on its
head row; the second finds the entries gone and leaves them to the first.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone

from apps.audit.models import (
    CURRENT,
    AuditCheckpoint,
    AuditEntry,
    AuditHead,
    AuditPending,
    Kind,
    Op,
    canonical,
    chain_link,
    link_v2,
)
from apps.receipts import body as receipt_body
from apps.receipts import keys
from apps.tenants.models import Tenant

BATCH = 2000
# A pass links at most this many entries; the rest wait for the next one.
PASS_LIMIT = 200_000


class _Taken(Exception):
    """Another linker took these entries first."""


def link_pending(limit: int = PASS_LIMIT) -> int:
    """Link every tenant's pending entries (at most `limit`); how many were linked.
    Reads only the pending queue: an idle pass reads an empty table."""
    linked = 0
    version_1 = AuditPending.objects.filter(xid__isnull=True)
    tenants = list(version_1.values_list("tenant_id", flat=True).distinct())
    for tenant_id in tenants:
        while linked < limit:
            done = _link_batch(tenant_id, min(BATCH, limit - linked))
            linked += done
            if done < BATCH:
                break
    return linked


def link_tenant(tenant: Tenant) -> int:
    linked = 0
    while (done := _link_batch(tenant.pk, BATCH)) == BATCH:
        linked += done
    return linked + done


def _link_batch(tenant_id: int, size: int) -> int:
    AuditHead.objects.get_or_create(tenant_id=tenant_id)
    try:
        with transaction.atomic():
            head = AuditHead.objects.select_for_update().get(tenant_id=tenant_id)
            pending = list(
                AuditPending.objects.filter(tenant_id=tenant_id, xid__isnull=True).order_by("id")[
                    :size
                ]
            )
            if not pending:
                return 0
            taken, _ = AuditPending.objects.filter(pk__in=[p.pk for p in pending]).delete()
            if taken != len(pending):
                raise _Taken
            entries = []
            n, link = head.n, head.link
            for item in pending:
                n += 1
                link = chain_link(
                    link, canonical(n, item.kind, item.row_id, item.op, item.digest, item.at)
                )
                entries.append(
                    AuditEntry(
                        tenant_id=tenant_id,
                        n=n,
                        kind=item.kind,
                        row_id=item.row_id,
                        run_id=item.run_id,
                        event_seq=item.event_seq,
                        op=item.op,
                        digest=item.digest,
                        at=item.at,
                        link=link,
                    )
                )
            AuditEntry.objects.bulk_create(entries, batch_size=500)
            AuditHead.objects.filter(pk=tenant_id).update(n=n, link=link)
            return len(pending)
    except _Taken:
        return 0


def append(tenant_id: int, kind: str, row_id: str, op: str, digest: str) -> AuditEntry:
    """Append one entry (version 2) to the tenant's chain, under its head row: what the
    triggers do in SQL, for a write made in Python (a checkpoint)."""
    AuditHead.objects.get_or_create(tenant_id=tenant_id)
    with transaction.atomic():
        head = AuditHead.objects.select_for_update().get(tenant_id=tenant_id)
        n, at = head.n + 1, timezone.now()
        entry = AuditEntry.objects.create(
            tenant_id=tenant_id,
            n=n,
            v=CURRENT,
            kind=kind,
            row_id=row_id,
            op=op,
            digest=digest,
            at=at,
            link=link_v2(head.link, n, kind, row_id, op, digest, at),
        )
        AuditHead.objects.filter(pk=tenant_id).update(n=n, link=entry.link)
        return entry


# Entries journaled this close before the oldest call that stays may be that call's own
# (the entry's time is the database's, the record's is Python's).
MARGIN = timedelta(seconds=5)


def checkpoint(tenant: Tenant, before: datetime) -> AuditCheckpoint | None:
    """After pruning `tenant`'s calls created before `before`: remove the chain's positions
    journaled before them (and before the oldest call that stays), leaving a checkpoint
    with their last link, signed with the receipts' key and itself chained. None when no
    position could go.

    What remains verifies from the checkpoint; an entry after it whose row was pruned
    (a pruned call's late event) is answered by the retention tombstones."""
    from apps.invocations.models import InvocationRecord

    link_tenant(tenant)
    oldest = (
        InvocationRecord.objects.filter(tenant=tenant)
        .order_by("created_at")
        .values_list("created_at", flat=True)
        .first()
    )
    until = min(before, oldest) if oldest is not None else before
    until -= MARGIN
    entries = AuditEntry.objects.filter(tenant=tenant)
    first_kept = _first_at_or_after(tenant, until)
    with transaction.atomic():
        head = AuditHead.objects.select_for_update().get(tenant=tenant)
        through = head.n if first_kept is None else first_kept - 1
        last = entries.filter(n__lte=through).order_by("-n").first()
        if last is None:
            return None
        first = entries.order_by("n").first()
        assert first is not None
        mark = AuditCheckpoint.objects.create(
            tenant=tenant,
            through_n=through,
            link=last.link,
            entries=through - first.n + 1,
            first_at=first.at,
            last_at=last.at,
            made_at=timezone.now(),
        )
        mark.signature = keys.signer().sign(receipt_body.canonical(mark.body()))
        mark.save(update_fields=["signature"])
        append(tenant.pk, Kind.CHECKPOINT, str(mark.pk), Op.INSERT, mark.digest())
    low = first.n
    while low <= through:  # short transactions, as pruning's own
        high = min(low + BATCH - 1, through)
        entries.filter(n__gte=low, n__lte=high).delete()
        low = high + 1
    return mark


def _first_at_or_after(tenant: Tenant, until: datetime) -> int | None:
    """The first position journaled at or after `until`, walking from the chain's start
    (what a pass prunes, not the history after it)."""
    after = 0
    while True:
        page = list(
            AuditEntry.objects.filter(tenant=tenant, n__gt=after)
            .order_by("n")
            .values_list("n", "at")[:BATCH]
        )
        for n, at in page:
            if at >= until:
                return int(n)
        if len(page) < BATCH:
            return None
        after = page[-1][0]
