"""Walking a tenant's chain: every link recomputed, every entry's row compared.

A walk reads the chain in pages by position (keyset on the (tenant, n) index), and per
page the current digests of the rows its entries name (one query per table), so its
memory is a page whatever the history. It stops at the first break:

- a position missing (an entry deleted from the chain);
- a link that does not follow from the one before (an entry edited, reordered or
  inserted, or a link rewritten);
- an `edit` entry: a record changed after it ended, or an event changed at all (with
  the triggers in place, an edit in the database is journaled like any write);
- an entry that is its row's last and no longer matches it (a row changed with the
  triggers off), or whose row is gone without a retention tombstone (a row deleted);
- a head that does not end where the chain ends (the head row edited, or the chain's
  tail deleted).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import connection, models
from django.db.models import Max
from django.db.models.expressions import RawSQL
from django.utils import timezone

from apps.audit import digests
from apps.audit.models import (
    GENESIS,
    AuditCheckpoint,
    AuditEntry,
    AuditHead,
    AuditPending,
    Kind,
    Op,
)
from apps.tenants.models import Tenant

PAGE = 500


@dataclass
class Break:
    n: int
    what: str

    def __str__(self) -> str:
        return f"#{self.n}: {self.what}"


@dataclass
class Walk:
    tenant: Tenant
    first_n: int | None = None
    last_n: int = 0
    checked: int = 0
    broken: Break | None = None
    pending: int = 0
    notes: list[str] = field(default_factory=list)


def anchor(tenant: Tenant) -> tuple[int, str, AuditCheckpoint | None]:
    """Where a full walk starts: after the latest checkpoint, else at the chain's start."""
    mark = AuditCheckpoint.objects.filter(tenant=tenant).order_by("-through_n").first()
    if mark is None:
        return 0, GENESIS, None
    return mark.through_n, mark.link, mark


def verify_tenant(tenant: Tenant, since: datetime | None = None) -> Walk:
    """The whole chain (or from the first position journaled at or after `since`)."""
    after, link, mark = anchor(tenant)
    walk = Walk(tenant=tenant)
    if mark is not None:
        problem = signature_problem(mark)
        if problem is not None:
            walk.broken = Break(mark.through_n, f"checkpoint {mark.pk}: {problem}")
            return walk
        walk.notes.append(
            f"from checkpoint {mark.pk} (signed, {_kid(mark)}): positions through "
            f"#{mark.through_n} pruned ({mark.entries} entries)"
        )
    if since is not None:
        start = _first_since(tenant, after, since)
        if start is None:
            walk.notes.append(f"nothing journaled since {since.isoformat()}")
            after = None  # type: ignore[assignment]
        elif start - 1 > after:
            before = AuditEntry.objects.filter(tenant=tenant, n=start - 1).first()
            if before is None:
                walk.broken = Break(start - 1, "position missing: an entry deleted from the chain")
                return walk
            after, link = before.n, before.link
    if after is not None:
        link = _walk(walk, after, link, stop=None)
        if walk.broken is None:
            _check_head(walk, link)
    walk.pending = AuditPending.objects.filter(tenant=tenant).count()
    older = unchained(tenant)
    if older is not None:
        walk.notes.append(older)
    return walk


def chain_began() -> datetime | None:
    """When the audit app's first migration ran: rows written before have no entry."""
    from django.db.migrations.recorder import MigrationRecorder

    return (
        MigrationRecorder.Migration.objects.filter(app="audit", name="0001_initial")
        .values_list("applied", flat=True)
        .first()
    )


def unchained(tenant: Tenant) -> str | None:
    """The tenant's rows written before the chain began and never chained since: how
    many and when (not a break: nothing could chain them as they were written)."""
    from django.db.models import CharField, Exists, Max, Min, OuterRef
    from django.db.models.functions import Cast

    from apps.invocations.models import InvocationRecord, RunEvent

    began = chain_began()
    if began is None:
        return None
    entries = AuditEntry.objects.filter(tenant=tenant)
    records = (
        InvocationRecord.objects.filter(tenant=tenant, created_at__lt=began)
        .annotate(key=Cast("pk", CharField()))
        .filter(~Exists(entries.filter(kind=Kind.RECORD, row_id=OuterRef("key"))))
        .aggregate(count=models.Count("pk"), first=Min("created_at"), last=Max("created_at"))
    )
    events = (
        RunEvent.objects.filter(tenant=tenant, at__lt=began)
        .annotate(key=Cast("pk", CharField()))
        .filter(~Exists(entries.filter(kind=Kind.EVENT, row_id=OuterRef("key"))))
        .aggregate(count=models.Count("pk"), first=Min("at"), last=Max("at"))
    )
    if not records["count"] and not events["count"]:
        return None
    times = [t for t in (records["first"], records["last"], events["first"], events["last"]) if t]
    return (
        f"{records['count']} records and {events['count']} events written before the chain "
        f"began (from {min(times).isoformat()} to {max(times).isoformat()}; the chain began "
        f"{began.isoformat()}): not chained, so not verified"
    )


def _walk(walk: Walk, after: int, link: str, stop: int | None) -> str:
    """Check positions after `after` (whose link is `link`) up to `stop`; the last link."""
    tenant = walk.tenant
    walk.last_n = after
    while walk.broken is None:
        query = AuditEntry.objects.filter(tenant=tenant, n__gt=walk.last_n)
        if stop is not None:
            query = query.filter(n__lte=stop)
        page = list(query.order_by("n")[:PAGE])
        if not page:
            return link
        hard: Break | None = None
        good: list[AuditEntry] = []
        expected = walk.last_n + 1
        for entry in page:
            if entry.n != expected:
                hard = Break(
                    expected,
                    f"positions #{expected}..#{entry.n - 1} missing: entries deleted from "
                    "the chain",
                )
                break
            if not entry.follows(link):
                hard = Break(
                    entry.n,
                    f"the link of {describe(entry)} does not follow from #{entry.n - 1}: an "
                    "entry edited, reordered or inserted, or a link rewritten",
                )
                break
            if entry.op == Op.EDIT:
                hard = Break(entry.n, _edited(entry))
                break
            good.append(entry)
            link, expected = entry.link, expected + 1
        row_break = _check_rows(tenant, good)
        if row_break is not None and (hard is None or row_break.n < hard.n):
            hard = row_break
        checked = [e for e in good if hard is None or e.n < hard.n]
        if checked:
            walk.first_n = walk.first_n or checked[0].n
            walk.last_n = checked[-1].n
            walk.checked += len(checked)
            link = checked[-1].link
        if hard is not None:
            walk.broken = hard
            return link
        if len(page) < PAGE:
            return link
    return link


def _check_head(walk: Walk, link: str) -> None:
    head = AuditHead.objects.filter(tenant=walk.tenant).first()
    if head is None:
        if walk.last_n:
            walk.broken = Break(walk.last_n, "the chain's head row is missing")
        return
    if head.n != walk.last_n:
        walk.broken = Break(
            head.n,
            f"the head says the chain ends at #{head.n}, but it ends at #{walk.last_n}: "
            + (
                "its last entries were deleted"
                if head.n > walk.last_n
                else "the head row was edited"
            ),
        )
    elif head.link != link:
        walk.broken = Break(
            head.n, f"the head's link differs from #{head.n}'s: the head row was edited"
        )


def signature_problem(mark: AuditCheckpoint) -> str | None:
    """Why the checkpoint's signature does not vouch for it, or None: it must verify with a
    published receipts key (the receipts' rules: Ed25519 only, a known kid, not past the
    key's retirement) and cover exactly the checkpoint's fields."""
    from apps.receipts import keys
    from apps.receipts.verification import ReceiptInvalid
    from apps.receipts.verification import verify as verify_jws

    if not mark.signature:
        return "not signed (an edited or forged checkpoint)"
    try:
        signed = verify_jws(mark.signature, keys.jwks())
    except ReceiptInvalid as exc:
        return f"its signature does not verify: {exc}"
    if signed != mark.body():
        differing = sorted(
            k for k in {*signed, *mark.body()} if signed.get(k) != mark.body().get(k)
        )
        return f"its fields differ from what its signature covers ({', '.join(differing)})"
    return None


def _kid(mark: AuditCheckpoint) -> str:
    from apps.receipts.verification import header_of

    return f"kid {header_of(mark.signature).get('kid')}"


def describe(entry: AuditEntry) -> str:
    if entry.kind == Kind.RECORD:
        return f"record {_uuid(entry.row_id)} (invocations_invocationrecord)"
    if entry.kind == Kind.EVENT:
        return f"event {entry.row_id} (invocations_runevent: run {entry.run_id} #{entry.event_seq})"
    return f"checkpoint {entry.row_id} (audit_auditcheckpoint)"


def _edited(entry: AuditEntry) -> str:
    when = entry.at.isoformat()
    if entry.kind == Kind.RECORD:
        return f"{describe(entry)} was changed after it ended, at {when} (an edited row)"
    return f"{describe(entry)} was changed at {when}; events are never changed (an edited row)"


def _uuid(row_id: str) -> str:
    try:
        return str(uuid.UUID(row_id))
    except ValueError:
        return row_id


def _current(tenant: Tenant, entries: list[AuditEntry]) -> dict[tuple[str, str, int], str]:
    """(kind, row id, version) -> the row's digest now, in each version these entries use,
    for the rows they name."""
    from apps.invocations.models import InvocationRecord, RunEvent

    vendor = connection.vendor
    quote = connection.ops.quote_name
    found: dict[tuple[str, str, int], str] = {}
    for v in sorted({e.v for e in entries}):
        chosen = [e for e in entries if e.v == v]
        records = {_uuid(e.row_id) for e in chosen if e.kind == Kind.RECORD}
        if records:
            table = quote(InvocationRecord._meta.db_table)
            records_now = (
                InvocationRecord.objects.filter(
                    tenant=tenant, pk__in=[uuid.UUID(r) for r in records]
                )
                .annotate(audit_digest=RawSQL(digests.record_digest(vendor, table, v), ()))  # noqa: S611 (names)
                .values_list("pk", "audit_digest")
            )
            found.update(((Kind.RECORD, str(pk), v), digest) for pk, digest in records_now)
        events = {int(e.row_id) for e in chosen if e.kind == Kind.EVENT}
        if events:
            table = quote(RunEvent._meta.db_table)
            events_now = (
                RunEvent.objects.filter(tenant=tenant, pk__in=events)
                .annotate(audit_digest=RawSQL(digests.event_digest(vendor, table, v), ()))  # noqa: S611 (names)
                .values_list("pk", "audit_digest")
            )
            found.update(((Kind.EVENT, str(pk), v), digest) for pk, digest in events_now)
        marks = {int(e.row_id) for e in chosen if e.kind == Kind.CHECKPOINT}
        for mark in AuditCheckpoint.objects.filter(tenant=tenant, pk__in=marks):
            found[(Kind.CHECKPOINT, str(mark.pk), v)] = mark.digest()
    return found


def _key(entry: AuditEntry) -> tuple[str, str, int]:
    row = _uuid(entry.row_id) if entry.kind == Kind.RECORD else entry.row_id
    return (entry.kind, row, entry.v)


def _check_rows(tenant: Tenant, entries: list[AuditEntry]) -> Break | None:
    """The first of these entries whose row was deleted, or which is its row's last entry
    and no longer matches it."""
    if not entries:
        return None
    current = _current(tenant, entries)
    missing = [e for e in entries if _key(e) not in current]
    differing = [e for e in entries if _key(e) in current and current[_key(e)] != e.digest]
    breaks: list[Break] = []
    if missing:
        pruned = _pruned(tenant, missing)
        breaks += [
            Break(e.n, f"{describe(e)} was deleted (its entry was written at {e.at.isoformat()})")
            for e in missing
            if e.pk not in pruned
        ]
    if differing:
        # An entry superseded by a later one of the same row is history, not a break.
        last = dict(
            AuditEntry.objects.filter(tenant=tenant, row_id__in={e.row_id for e in differing})
            .values("row_id")
            .annotate(last=Max("n"))
            .values_list("row_id", "last")
        )
        breaks += [
            Break(
                e.n,
                f"{describe(e)} differs from its last entry (written {e.at.isoformat()}): "
                "an edited row, changed without its trigger",
            )
            for e in differing
            if last.get(e.row_id, e.n) <= e.n
        ]
    return min(breaks, key=lambda b: b.n) if breaks else None


def _pruned(tenant: Tenant, missing: list[AuditEntry]) -> set[int]:
    """The entries (ids) of these whose rows retention removed: a tombstone names them."""
    from apps.retention.models import PrunedId, PrunedRun

    gone: set[int] = set()
    records = [e for e in missing if e.kind == Kind.RECORD]
    if records:
        tombs = {
            str(pk)
            for pk in PrunedId.objects.filter(
                kind=PrunedId.Kind.RECORD, pk__in=[uuid.UUID(e.row_id) for e in records]
            ).values_list("pk", flat=True)
        }
        gone.update(e.pk for e in records if _uuid(e.row_id) in tombs)
    events = [e for e in missing if e.kind == Kind.EVENT]
    if events:
        through = dict(
            PrunedRun.objects.filter(
                tenant=tenant, run_id__in={e.run_id for e in events}
            ).values_list("run_id", "through_seq")
        )
        gone.update(
            e.pk
            for e in events
            if e.event_seq is not None and e.event_seq <= through.get(e.run_id, 0)
        )
    return gone


def _first_since(tenant: Tenant, after: int, since: datetime) -> int | None:
    """The first position journaled at or after `since`, by bisecting positions (their
    times grow with them), through the (tenant, n) index."""
    entries = AuditEntry.objects.filter(tenant=tenant)
    last = entries.filter(n__gt=after).order_by("-n").values_list("n", "at").first()
    if last is None or last[1] < since:
        return None
    low, high = after + 1, int(last[0])
    while low < high:
        middle = (low + high) // 2
        found = entries.filter(n__gte=middle).order_by("n").values_list("n", "at").first()
        assert found is not None
        if found[1] >= since:
            high = middle
        else:
            low = int(found[0]) + 1
    return low


# ------------------------------------------------------------------ the console's check

# The console verifies at most this many positions on a page view; beyond, it says so.
CONSOLE_LIMIT = 5000


@dataclass
class RecordStatus:
    state: str  # verified | broken | pending | unverified | absent
    text: str

    @property
    def label(self) -> str:
        return LABELS[self.state]


LABELS = {
    "verified": "verified",
    "broken": "broken",
    "pending": "not yet linked",
    "unverified": "not verified yet",
    "absent": "not chained",
}


def record_status(record: Any) -> RecordStatus:
    """Whether the chain verifies up to this call's last entry: from the last verified
    position (kept on the head, a cache of earlier walks) to it, at most CONSOLE_LIMIT
    positions; the walk's outcome moves the head's marks."""
    tenant = record.tenant
    keys = {record.pk.hex, str(record.pk)}
    waiting = list(AuditPending.objects.filter(tenant=tenant, row_id__in=keys).order_by("id"))
    edited = next((item for item in waiting if item.op == Op.EDIT), None)
    if edited is not None:
        return RecordStatus("broken", f"{_edited(edited)} (journaled, not linked yet).")  # type: ignore[arg-type]
    if waiting:
        return RecordStatus("pending", "Journaled, not linked yet (the sweeper links it).")
    entry = AuditEntry.objects.filter(tenant=tenant, row_id__in=keys).order_by("-n").first()
    if entry is None:
        return RecordStatus(
            "absent", "Not in the audit chain (pruned, or written before the chain began)."
        )
    vendor = connection.vendor
    table = connection.ops.quote_name(type(record)._meta.db_table)
    now = (
        type(record)
        .objects.filter(pk=record.pk)
        .annotate(audit_digest=RawSQL(digests.record_digest(vendor, table, entry.v), ()))  # noqa: S611 (names)
        .values_list("audit_digest", flat=True)
        .first()
    )
    if now != entry.digest:
        return RecordStatus(
            "broken",
            f"This record differs from its chain entry #{entry.n}: edited in the database.",
        )
    if entry.op == Op.EDIT:
        return RecordStatus("broken", f"Chain entry #{entry.n}: {_edited(entry)}.")
    head, _ = AuditHead.objects.get_or_create(tenant=tenant)
    if head.broken_n is not None and head.broken_n <= entry.n:
        return RecordStatus("broken", f"The chain breaks before this call: {head.broken}")
    if entry.n > head.verified_n:
        _advance(head, entry.n)
    if head.broken_n is not None and head.broken_n <= entry.n:
        return RecordStatus("broken", f"The chain breaks before this call: {head.broken}")
    if entry.n <= head.verified_n:
        return RecordStatus(
            "verified", f"The chain verifies up to this call (entry #{entry.n} of {head.n})."
        )
    return RecordStatus(
        "unverified",
        f"Entry #{entry.n}, more than {CONSOLE_LIMIT} positions past the last verified one "
        f"(#{head.verified_n}): run manage.py verify_audit.",
    )


def _advance(head: AuditHead, upto: int) -> None:
    after, link, mark = anchor(head.tenant)
    walk = Walk(tenant=head.tenant)
    if head.verified_n > after:
        marked = AuditEntry.objects.filter(tenant=head.tenant, n=head.verified_n).first()
        if marked is not None:
            after, link = marked.n, marked.link
    elif mark is not None and (problem := signature_problem(mark)) is not None:
        walk.broken = Break(mark.through_n, f"checkpoint {mark.pk}: {problem}")
    if upto - after > CONSOLE_LIMIT:
        return
    if walk.broken is None:
        _walk(walk, after, link, stop=upto)
    head.verified_n = max(head.verified_n, walk.last_n)
    head.verified_at = timezone.now()
    if walk.broken is not None:
        head.broken_n, head.broken = walk.broken.n, str(walk.broken)[:500]
    AuditHead.objects.filter(pk=head.pk).update(
        verified_n=head.verified_n,
        verified_at=head.verified_at,
        broken_n=head.broken_n,
        broken=head.broken,
    )


def remember(walk: Walk) -> None:
    """A full walk's outcome, for the console."""
    values: dict[str, Any] = {"verified_at": timezone.now()}
    if walk.broken is not None:
        values.update(broken_n=walk.broken.n, broken=str(walk.broken)[:500])
    else:
        values.update(verified_n=walk.last_n, broken_n=None, broken="")
    AuditHead.objects.filter(tenant=walk.tenant).update(**values)
