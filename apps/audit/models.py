"""The tamper-evident chain: per tenant, every record and event write, hashed in order.

Triggers append each write to its tenant's chain within the writing transaction
(whatever wrote it: the runner, the combined PostgreSQL statement, a worker, the
sweeper, a raw UPDATE): `AuditEntry`, position `n`, with the digest of the row's audited
columns (apps.audit.digests) and link n = SHA-256(link n-1 || the entry's canonical
bytes), under the tenant's `AuditHead` row (its last position and link). SQLite appends
in the writing statement; PostgreSQL journals the write in `AuditPending` and appends
the transaction's writes as it commits, locking heads in tenant order (no deadlock
between transactions writing two tenants) from there to the commit only.
Pruning leaves an `AuditCheckpoint` (the last link of the range it removed), itself
chained as an entry. See docs/audit.md for what the chain proves and what it does not.

Versions (`AuditEntry.v`): 1, the entries linked by the sweeper from `AuditPending`
before migration 0003 (digest without the receipt and the trace context, link over a
JSON array); 2, linked as written (every audited column, link over `canonical_v2`).
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import models

from apps.tenants.models import Tenant

GENESIS = "0" * 64


class Kind(models.TextChoices):
    RECORD = "record"
    EVENT = "event"
    CHECKPOINT = "checkpoint"


class Op(models.TextChoices):
    INSERT = "insert"
    UPDATE = "update"  # a record's change before it ended (start, end)
    EDIT = "edit"  # a change after the record ended, or any change of an event: never ours


class AuditPending(models.Model):
    """A write journaled but not linked yet. Version 2, PostgreSQL: a write of the open
    transaction `xid`, appended to the chain when it commits (never seen by anyone else).
    Version 1 (`xid` NULL): the queue the triggers filled before migration 0003, which
    linked what was left; the sweeper links any that remain."""

    id = models.BigAutoField(primary_key=True)
    # No database constraint: the trigger's insert needs no lookup of the tenant.
    tenant = models.ForeignKey(
        Tenant, on_delete=models.CASCADE, related_name="+", db_index=False, db_constraint=False
    )
    kind = models.CharField(max_length=10, choices=Kind.choices)
    row_id = models.CharField(max_length=40)
    run_id = models.CharField(max_length=128, blank=True)
    event_seq = models.PositiveBigIntegerField(null=True)
    op = models.CharField(max_length=6, choices=Op.choices)
    digest = models.CharField(max_length=64)
    at = models.DateTimeField()
    xid = models.BigIntegerField(null=True, blank=True, help_text="The writing transaction.")

    class Meta:
        indexes = [models.Index(fields=["tenant", "id"]), models.Index(fields=["xid"])]

    def __str__(self) -> str:
        return f"{self.kind} {self.row_id} {self.op} (pending)"


class AuditEntry(models.Model):
    """Position `n` of a tenant's chain."""

    id = models.BigAutoField(primary_key=True)
    # db_index=False: both indexes lead with it.
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+", db_index=False)
    n = models.PositiveBigIntegerField()
    kind = models.CharField(max_length=10, choices=Kind.choices)
    row_id = models.CharField(max_length=40)
    run_id = models.CharField(max_length=128, blank=True)
    event_seq = models.PositiveBigIntegerField(null=True)
    op = models.CharField(max_length=6, choices=Op.choices)
    digest = models.CharField(max_length=64)
    at = models.DateTimeField()
    link = models.CharField(max_length=64)
    v = models.PositiveSmallIntegerField(default=1, help_text="Digest and link version.")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant", "n"], name="one_entry_per_n")]
        # A record's entries (the console's check of one call).
        indexes = [models.Index(fields=["tenant", "row_id"])]

    def __str__(self) -> str:
        return f"#{self.n} {self.kind} {self.row_id} {self.op}"

    def canonical(self) -> bytes:
        return canonical(self.n, self.kind, self.row_id, self.op, self.digest, self.at)

    def follows(self, previous_link: str) -> bool:
        if self.v == 1:
            return self.link == chain_link(previous_link, self.canonical())
        return self.link == link_v2(
            previous_link, self.n, self.kind, self.row_id, self.op, self.digest, self.at
        )


CURRENT = 2
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def canonical_v2(n: int, kind: str, row_id: str, op: str, digest: str, at: datetime) -> str:
    """What a version 2 link hashes after the previous link (both as text): every field
    is ASCII without a `|`, the time in integer microseconds since the epoch. The
    triggers build the same text in SQL (apps.audit.digests)."""
    micros = (at - _EPOCH) // timedelta(microseconds=1)
    return f"2|{n}|{kind}|{row_id}|{op}|{digest}|{micros}"


def link_v2(
    previous: str, n: int, kind: str, row_id: str, op: str, digest: str, at: datetime
) -> str:
    text = previous + canonical_v2(n, kind, row_id, op, digest, at)
    return hashlib.sha256(text.encode()).hexdigest()


def canonical(n: int, kind: str, row_id: str, op: str, digest: str, at: datetime) -> bytes:
    """The bytes a version 1 entry's link hashes after the previous link."""
    return json.dumps([n, kind, row_id, op, digest, at.isoformat()], separators=(",", ":")).encode()


def chain_link(previous: str, entry: bytes) -> str:
    return hashlib.sha256(bytes.fromhex(previous) + entry).hexdigest()


class AuditHead(models.Model):
    """A tenant's chain: its last position and link (locked by the linker, per tenant),
    and how far a verification last got (what the console shows)."""

    tenant = models.OneToOneField(
        Tenant, on_delete=models.CASCADE, primary_key=True, related_name="+"
    )
    n = models.PositiveBigIntegerField(default=0)
    link = models.CharField(max_length=64, default=GENESIS)
    verified_n = models.PositiveBigIntegerField(default=0)
    verified_at = models.DateTimeField(null=True, blank=True)
    broken_n = models.PositiveBigIntegerField(null=True, blank=True)
    broken = models.CharField(max_length=500, blank=True)

    def __str__(self) -> str:
        return f"{self.tenant_id} at #{self.n}"


class AuditCheckpoint(models.Model):
    """Pruning removed positions up to `through_n`: their last link, count and times.

    The chain goes on from `link`; the checkpoint is signed with the receipts' key
    (apps.receipts: a compact JWS of `body()`, checked against the published keys) and
    itself chained as an entry, so an edit of it breaks the walk twice over.
    """

    # db_index=False: the (tenant, -through_n) index leads with it.
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+", db_index=False)
    through_n = models.PositiveBigIntegerField()
    link = models.CharField(max_length=64)
    entries = models.PositiveBigIntegerField()
    first_at = models.DateTimeField(null=True)
    last_at = models.DateTimeField(null=True)
    made_at = models.DateTimeField()
    signature = models.TextField(blank=True, help_text="A compact JWS of body() (Ed25519).")

    class Meta:
        indexes = [models.Index(fields=["tenant", "-through_n"])]

    def __str__(self) -> str:
        return f"{self.tenant_id} through #{self.through_n}"

    def body(self) -> dict[str, Any]:
        """What the signature covers (`signedAt`: when, as receipts name it)."""
        return {
            "checkpoint": self.pk,
            "tenant": self.tenant_id,
            "throughN": self.through_n,
            "link": self.link,
            "entries": self.entries,
            "firstAt": _instant(self.first_at),
            "lastAt": _instant(self.last_at),
            "signedAt": _instant(self.made_at),
        }

    def digest(self) -> str:
        """What its chain entry holds: its body and its signature."""
        body = [self.body(), self.signature]
        return hashlib.sha256(json.dumps(body, separators=(",", ":")).encode()).hexdigest()


def _instant(value: datetime | None) -> str | None:
    return None if value is None else value.astimezone(UTC).isoformat().replace("+00:00", "Z")
