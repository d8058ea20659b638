"""Invocation records and the per-run event log."""

from __future__ import annotations

import hashlib
import secrets
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from django.contrib.sessions.models import Session
from django.db import connections, models
from django.utils import timezone

from apps.tenants.models import ApiKey, Tenant
from apps.tools.models import Tool
from toolhub.db.postgresql import statement_cursor


class ErrorCode(models.TextChoices):
    UNAVAILABLE = "unavailable"
    POLICY_DENIED = "policy_denied"
    AUTHZ_DENIED = "authz_denied"
    INVALID_JSON = "invalid_json"
    VALIDATION = "validation"
    APPROVAL_REJECTED = "approval_rejected"
    APPROVAL_EXPIRED = "approval_expired"
    EXECUTION = "execution"
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"
    OUTPUT_INVALID = "output_invalid"
    RESULT_TOO_LARGE = "result_too_large"
    REDACTION_FAILED = "redaction_failed"
    RATE_LIMITED = "rate_limited"


class Status(models.TextChoices):
    PENDING_APPROVAL = "pending_approval"
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


class InvocationRecord(models.Model):
    """One attempted tool call, refused ones included. Args and result are redacted."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # db_index=False: each of the record's indexes leads with it (tests/test_indexes.py).
    tenant = models.ForeignKey(
        Tenant, on_delete=models.CASCADE, related_name="invocations", db_index=False
    )
    # Indexed in Meta: a plain index, without the LIKE one PostgreSQL would add for a text key.
    tool = models.ForeignKey(
        Tool, null=True, blank=True, on_delete=models.SET_NULL, related_name="+", db_index=False
    )
    tool_ref = models.CharField(max_length=200, help_text="The tool id as requested.")
    tool_call_id = models.CharField(max_length=128)
    run_id = models.CharField(max_length=128)
    principal = models.CharField(max_length=160)
    connection_id = models.CharField(max_length=64, blank=True)
    # NULL, not "", for "no key": the unique constraint below must ignore keyless calls.
    idempotency_key = models.CharField(max_length=200, null=True, blank=True)  # noqa: DJ001
    request_hash = models.CharField(max_length=64, blank=True)
    status = models.CharField(max_length=20, choices=Status.choices)
    ok = models.BooleanField(null=True)
    args = models.JSONField(null=True, blank=True)
    args_shape = models.JSONField(null=True, blank=True, help_text="Keys and types, never values.")
    result = models.JSONField(null=True, blank=True)
    error_code = models.CharField(max_length=24, choices=ErrorCode.choices, blank=True)
    safe_message = models.CharField(max_length=1000, blank=True)
    policy_rule = models.CharField(max_length=300, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    duration_ms = models.PositiveIntegerField(null=True, blank=True)
    cancel_requested = models.BooleanField(default=False)

    retry_after_ms = models.PositiveIntegerField(
        null=True, blank=True, help_text="rate_limited: when the next call may pass, from ended_at."
    )
    traceparent = models.CharField(
        max_length=55,
        blank=True,
        help_text="The W3C trace context the caller sent (MCP's traceparent).",
    )
    # NULL until the call ends. Nullable so that adding it is an ALTER TABLE ADD COLUMN on
    # SQLite: a NOT NULL column remakes the table, and the table's triggers (0007) with it.
    receipt = models.TextField(  # noqa: DJ001
        null=True,
        blank=True,
        help_text="The signed receipt of the ended call, a compact JWS (apps/receipts).",
    )
    # Nullable, without a default, for the same reason as the receipt.
    cache_hit = models.BooleanField(
        null=True, blank=True, help_text="True: answered from the result cache, nothing ran."
    )
    hooks = models.JSONField(
        null=True, blank=True, help_text="What each hook (settings.TOOLHUB_HOOKS) did, in order."
    )
    # A call whose idempotency key's last attempt failed (or was cancelled) runs again: it
    # names that attempt, and counts (2, 3...). Null on a first attempt. Nullable columns
    # without defaults: SQLite adds them without rebuilding the table (and its triggers).
    retry_of = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="+", db_index=False
    )
    attempt = models.PositiveSmallIntegerField(null=True, blank=True)
    # The runner's own retries (unavailable, timeout) of this call before its last try:
    # [{attempt, errorCode, safeMessage, durationMs, retryAfterMs?, waitMs}]. Null: none.
    retries = models.JSONField(null=True, blank=True)
    # The call's lease (apps/invocations/leases.py): set when it starts running, renewed by
    # its process while it runs; past it, the process is taken to be dead and the call is
    # settled. `tool_pending`: True while the tool has not been handed the call (it waits
    # for a concurrency slot), so a dead process's call is known never to have run.
    # Nullable without defaults: SQLite adds them without rebuilding the table.
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    tool_pending = models.BooleanField(null=True, blank=True)
    # Who holds the lease: the process that runs the call (leases.Life.token), so that a
    # retry can tell at once whether it died (its liveness lock is free) without waiting
    # for the lease to run out.
    lease_owner = models.CharField(max_length=120, null=True, blank=True)  # noqa: DJ001
    # How the key above was made (apps/invocations/ledger.py): `custom` (the caller's),
    # `auto` or `params` (derived by the tool's strategy). Null: the call has no key.
    idempotency_strategy = models.CharField(  # noqa: DJ001
        max_length=8, null=True, blank=True, help_text="custom (the caller's key), auto, params"
    )

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["tenant", "principal", "created_at"]),
            # A run's records newest first: the admin's search by run id (one run may hold
            # 100,000 calls; a page reads its newest 100 entries, no sort).
            models.Index(
                fields=["tenant", "run_id", "-created_at", "-id"], name="invocations_run_newest_idx"
            ),
            models.Index(fields=["tenant", "-created_at"]),
            models.Index(fields=["tenant", "tool_call_id"]),
            models.Index(fields=["tool"], name="invocations_tool_idx"),
            # Every tenant's records, newest first: the superuser's admin list (ordered by
            # created_at, then id). Queries that must not walk it (the sweeper's reads of
            # unfinished calls) say `.order_by()`: see docs/performance.md.
            models.Index(fields=["-created_at", "-id"], name="invocations_newest_idx"),
            # The calls not ended yet, a handful whatever the history: what the sweeper's
            # settle_abandoned_records and the in-flight counts read. A condition without
            # parameters: SQLite matches `ended_at IS NULL`, not an IN list sent as `?`s.
            models.Index(
                fields=["started_at"],
                condition=models.Q(ended_at__isnull=True),
                name="invocations_unfinished_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.tool_ref} {self.tool_call_id} ({self.status})"

    def as_api(self) -> dict[str, Any]:
        """The record as the API shows it (camelCase, empty optional fields left out).

        Built by hand, not by DRF's field machinery: every call's response is one of
        these (issue 13). InvocationSerializer declares the same fields for the API
        document and uses this for its output; tests compare both with the document.
        """
        approval = getattr(self, "approval", None)  # reverse one-to-one: absent -> None
        data: dict[str, Any] = {
            "invocationId": str(self.id),
            "toolCallId": self.tool_call_id,
            "runId": self.run_id,
            "toolId": self.tool_ref,
            "status": self.status,
        }
        if self.ok is not None:
            data["ok"] = self.ok
        if self.ok is True and self.result is not None:
            data["result"] = self.result
        failure: tuple[tuple[str, Any], ...] = (
            ("errorCode", self.error_code),
            ("safeMessage", self.safe_message),
            ("retryAfterMs", self.retry_after_ms),
        )
        data.update((name, value) for name, value in failure if value not in (None, ""))
        data["args"] = self.args
        data["principal"] = self.principal
        context: tuple[tuple[str, Any], ...] = (
            ("connectionId", self.connection_id),
            ("idempotencyKey", self.idempotency_key),
            ("idempotencyStrategy", self.idempotency_strategy),
            ("policyRule", self.policy_rule),
        )
        data.update((name, value) for name, value in context if value not in (None, ""))
        if self.cache_hit:
            data["cacheHit"] = True
        if self.hooks:
            data["hooks"] = self.hooks
        if self.retry_of_id is not None:
            data["retryOf"] = str(self.retry_of_id)
        if self.attempt is not None:
            data["attempt"] = self.attempt
        if self.retries:
            data["retries"] = self.retries
        data["createdAt"] = _instant(self.created_at)
        data["startedAt"] = _instant(self.started_at)
        data["endedAt"] = _instant(self.ended_at)
        data["durationMs"] = self.duration_ms
        if approval is not None:
            data["approvalId"] = str(approval.pk)
        if self.receipt:
            data["receipt"] = self.receipt
        return data


def _instant(value: datetime | None) -> str | None:
    """ISO 8601 in UTC with a Z, as DRF's DateTimeField writes it."""
    if value is None:
        return None
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


class ConcurrencySlot(models.Model):
    """One call running under a concurrency limit, as a lease (apps/invocations/concurrency.py).

    Taken before the tool runs, given back when its thread really ends (a call that timed
    out keeps it while its thread still runs); renewed by the process holding it while
    it does, so a process that dies frees its slots when their lease runs out."""

    # db_index=False: the (tenant, expires_at) index leads with it (tests/test_indexes.py).
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+", db_index=False)
    tool_id = models.CharField(max_length=140)
    acquired_at = models.DateTimeField()
    ends_by = models.DateTimeField(help_text="The call's deadline: the retry hint's estimate.")
    expires_at = models.DateTimeField(help_text="The lease: renewed while the tool's thread runs.")

    class Meta:
        indexes = [
            models.Index(fields=["tool_id", "expires_at"]),
            models.Index(fields=["tenant", "expires_at"]),
        ]

    def __str__(self) -> str:
        return f"{self.tool_id} ({self.tenant_id}) until {self.expires_at}"


class IdempotencyEntryQuerySet(models.QuerySet["IdempotencyEntry"]):
    def forgettable(self, limit: int, now: datetime | None = None) -> list[int]:
        """Up to `limit` entries past their expiry whose call has ended (a running call
        keeps its key whatever its TTL or an invalidation says, so no second attempt runs
        beside it). Two reads, never a join: the expired entries by the expiry index,
        then their records by key. Joined, SQLite's planner (once ANALYZE has run, with
        few entries) walked every record to find the entries (test_flat_cost)."""
        expired = list(
            self.filter(expires_at__lte=now or timezone.now())
            .order_by("expires_at")
            .values_list("pk", "record_id")[:limit]
        )
        ended = set(
            InvocationRecord.objects.filter(
                pk__in=[record for _, record in expired], ended_at__isnull=False
            )
            .order_by()
            .values_list("pk", flat=True)
        )
        return [pk for pk, record in expired if record in ended]


class IdempotencyEntry(models.Model):
    """The idempotency ledger: a key of a tenant's partition (its scope), held by the call
    that used it last (apps/invocations/ledger.py).

    The key is remembered while that call is unfinished, and after it succeeded until
    `expires_at`; a failed or cancelled call leaves it free, and the next call with it
    takes the row over (compare-and-set on `record`). One row per key, enforced by the
    database, so concurrent first uses cannot both run.
    """

    # db_index=False: one_entry_per_key leads with it (tests/test_indexes.py).
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+", db_index=False)
    digest = models.CharField(max_length=64, help_text="sha256 of the scope's partition and key.")
    key = models.CharField(max_length=200, help_text="The caller's key, or the derived one.")
    tool_ref = models.CharField(max_length=200)
    principal = models.CharField(max_length=160)
    run_id = models.CharField(max_length=128, blank=True)
    strategy = models.CharField(max_length=8)
    scope = models.CharField(max_length=10)
    record = models.OneToOneField(InvocationRecord, on_delete=models.CASCADE, related_name="+")
    claimed_at = models.DateTimeField()
    expires_at = models.DateTimeField()

    objects = IdempotencyEntryQuerySet.as_manager()

    class Meta:
        verbose_name_plural = "idempotency entries"
        constraints = [
            models.UniqueConstraint(fields=["tenant", "digest"], name="one_entry_per_key")
        ]
        indexes = [
            models.Index(fields=["expires_at"], name="ledger_expiry_idx"),
            models.Index(fields=["tenant", "tool_ref"], name="ledger_tool_idx"),
            models.Index(fields=["tenant", "principal"], name="ledger_principal_idx"),
            models.Index(fields=["tenant", "key"], name="ledger_key_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.key} ({self.tool_ref}, {self.principal})"


class CallWindow(models.Model):
    """One principal's rate-limit window: the row its admissions lock, one after another.

    The admitted calls of the last minute hang off it (`AdmittedCall`); see
    apps/invocations/ratelimit.py for why a sliding log and how it is cleaned up.
    """

    # db_index=False: one_window_per_principal leads with it (tests/test_indexes.py).
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+", db_index=False)
    principal = models.CharField(max_length=160)
    last_admitted_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "principal"], name="one_window_per_principal")
        ]
        indexes = [models.Index(fields=["last_admitted_at"])]

    def __str__(self) -> str:
        return f"{self.principal} ({self.tenant_id})"


class AdmittedCall(models.Model):
    """One call the rate limit let through, at `at`; forgotten once a window has passed."""

    # db_index=False: the (window, at) index leads with it (tests/test_indexes.py).
    window = models.ForeignKey(
        CallWindow, on_delete=models.CASCADE, related_name="admitted", db_index=False
    )
    at = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["window", "at"])]

    def __str__(self) -> str:
        return f"{self.window} at {self.at}"


class RunQuerySet(models.QuerySet["Run"]):
    def next_seq(self, tenant: Tenant, run_id: str, count: int = 1) -> int:
        """Allocate the run's next event number (or `count` of them, returning the last);
        call inside a transaction.

        One statement, for a run's first events as for its later ones (issue 13): an
        upsert on the (tenant, run_id) constraint (SQLite 3.24+, PostgreSQL 9.5+). It
        locks the run's row until commit, so concurrent emitters on one run take numbers
        one after another and commit in that order; two first emitters of a new run
        meet on the unique index, and the second one's insert becomes the update.
        """
        db = connections[self.db]
        quote = db.ops.quote_name
        table = quote(Run._meta.db_table)
        with statement_cursor(db) as cursor:
            cursor.execute(
                f"INSERT INTO {table} (tenant_id, run_id, last_seq, created_at) "  # noqa: S608
                "VALUES (%s, %s, %s, %s) ON CONFLICT (tenant_id, run_id) "
                f"DO UPDATE SET last_seq = {table}.last_seq + excluded.last_seq "
                "RETURNING last_seq",
                [tenant.pk, run_id, count, db.ops.adapt_datetimefield_value(timezone.now())],
            )
            row = cursor.fetchone()
        return int(row[0])

    def next_seqs(self, counts: dict[tuple[int, str], int]) -> dict[tuple[int, str], int]:
        """next_seq for several runs in one statement: (tenant id, run id) -> how many
        numbers, answered with each run's last. The runs' rows are locked in a fixed order
        (sorted), so two transactions allocating for the same runs cannot deadlock."""
        db = connections[self.db]
        quote = db.ops.quote_name
        table = quote(Run._meta.db_table)
        now = db.ops.adapt_datetimefield_value(timezone.now())
        keys = sorted(counts)
        params: list[Any] = []
        for tenant_id, run_id in keys:
            params += [tenant_id, run_id, counts[(tenant_id, run_id)], now]
        with statement_cursor(db) as cursor:
            cursor.execute(
                f"INSERT INTO {table} (tenant_id, run_id, last_seq, created_at) VALUES "  # noqa: S608
                + ", ".join(["(%s, %s, %s, %s)"] * len(keys))
                + " ON CONFLICT (tenant_id, run_id) "
                f"DO UPDATE SET last_seq = {table}.last_seq + excluded.last_seq "
                "RETURNING tenant_id, run_id, last_seq",
                params,
            )
            found = {(int(tenant_id), str(run_id)): int(last) for tenant_id, run_id, last in cursor}
        return found


class Run(models.Model):
    # db_index=False: unique_run leads with it (tests/test_indexes.py).
    tenant = models.ForeignKey(
        Tenant, on_delete=models.CASCADE, related_name="runs", db_index=False
    )
    run_id = models.CharField(max_length=128)
    last_seq = models.PositiveBigIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    # Per-run narrowing (apps/invocations/runs.py): the tool ids this run may call, set
    # when the run is started and fixed from then on; NULL: not narrowed. The event
    # allocation's raw INSERT leaves both columns out, so both take the database's NULL/"".
    tool_allowlist = models.JSONField(
        null=True, blank=True, help_text="The only tools this run may call (null: not narrowed)."
    )
    started_by = models.CharField(
        max_length=160, blank=True, db_default="", help_text="Who set the allowlist."
    )

    objects = RunQuerySet.as_manager()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant", "run_id"], name="unique_run")]
        indexes = [
            # Whether a tenant has narrowed runs at all (runs.py): its runs without an
            # allowlist, nearly all of them, are not read.
            models.Index(
                fields=["tenant"],
                condition=models.Q(tool_allowlist__isnull=False),
                name="narrowed_runs_idx",
            )
        ]

    def __str__(self) -> str:
        return self.run_id


class RunEvent(models.Model):
    # db_index=False: unique_event_seq leads with it (tests/test_indexes.py).
    tenant = models.ForeignKey(
        Tenant, on_delete=models.CASCADE, related_name="events", db_index=False
    )
    run_id = models.CharField(max_length=128)
    seq = models.PositiveBigIntegerField()
    type = models.CharField(max_length=40)
    tool_call_id = models.CharField(max_length=128)
    tool_id = models.CharField(max_length=200)
    message = models.JSONField(help_text="The event exactly as streamed.")
    at = models.DateTimeField()

    class Meta:
        ordering = ["tenant", "run_id", "seq"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "run_id", "seq"], name="unique_event_seq")
        ]
        indexes = [
            # A call's result event, found without reading its run's other events (an MCP
            # session's run holds all its calls): the sweeper checks each ended call.
            models.Index(
                fields=["tenant", "run_id", "tool_call_id"],
                condition=models.Q(type="tool_call_result"),
                name="events_result_idx",
            )
        ]

    def __str__(self) -> str:
        return f"{self.run_id}#{self.seq} {self.type}"


# The statuses a call ends in; a record in one of them is counted (CallEnd) once.
FINAL_STATUSES = (Status.SUCCEEDED, Status.FAILED, Status.CANCELLED)
UNFINISHED_STATUSES = (Status.PENDING_APPROVAL, Status.QUEUED, Status.RUNNING)


class CallEnd(models.Model):
    """A call that ended and is not yet counted: a queue the sweeper empties.

    Written by database triggers on the records table (migration 0007), in the statement
    that makes a record final, whichever path wrote it (the runner's statements, the
    combined PostgreSQL statement, a worker's Closing, the sweeper, an admin's edit): a
    record's end and its row here commit together or not at all. A final record edited
    later adds a row of sign -1 for what it was and one of +1 for what it is. The sweeper
    (apps.invocations.rollups.fold) deletes a batch, adds it to CallTotal and CallMinute
    and checks each ended call's tool_call_result, so a pass reads what ended since the
    last one, never the history.
    """

    id = models.BigAutoField(primary_key=True)
    sign = models.SmallIntegerField(default=1)
    record_id = models.UUIDField()
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+", db_index=False)
    run_id = models.CharField(max_length=128)
    tool_call_id = models.CharField(max_length=128)
    tool_ref = models.CharField(max_length=200)
    principal = models.CharField(max_length=160)
    status = models.CharField(max_length=20)
    error_code = models.CharField(max_length=24, blank=True)
    ended_at = models.DateTimeField(null=True)
    duration_ms = models.PositiveIntegerField(null=True)

    def __str__(self) -> str:
        return f"{self.tool_ref} {self.status} ({self.sign:+d})"


class CallTotal(models.Model):
    """Calls ended since the beginning, per tenant, tool and status, with their latency
    histogram (`buckets[i]`: calls of at most stats.LATENCY_BUCKETS[i] seconds, cumulative).
    What /metrics reports, with the CallEnd rows not folded yet added."""

    # db_index=False: one_total_per_key leads with it (tests/test_indexes.py).
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+", db_index=False)
    tool_ref = models.CharField(max_length=200)
    status = models.CharField(max_length=20)
    calls = models.BigIntegerField(default=0)
    timed = models.BigIntegerField(default=0, help_text="Calls with a duration.")
    sum_ms = models.BigIntegerField(default=0)
    buckets = models.JSONField(default=list)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "tool_ref", "status"], name="one_total_per_key"
            )
        ]

    def __str__(self) -> str:
        return f"{self.tool_ref} {self.status}: {self.calls}"


class CallMinute(models.Model):
    """Calls ended in one minute, per tenant, tool, status and error code, with their
    latency histogram; the principal only for a denial (the overview's top denied
    principals), else "". What the overview draws; kept MINUTES_KEPT by the sweeper."""

    minute = models.DateTimeField()
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+", db_index=False)
    tool_ref = models.CharField(max_length=200)
    status = models.CharField(max_length=20)
    error_code = models.CharField(max_length=24, blank=True)
    principal = models.CharField(max_length=160, blank=True)
    calls = models.BigIntegerField(default=0)
    timed = models.BigIntegerField(default=0)
    sum_ms = models.BigIntegerField(default=0)
    buckets = models.JSONField(default=list)

    class Meta:
        constraints = [
            # Leads with the minute: the overview reads a window, the sweeper drops the past.
            models.UniqueConstraint(
                fields=["minute", "tenant", "tool_ref", "status", "error_code", "principal"],
                name="one_minute_per_key",
            )
        ]

    def __str__(self) -> str:
        return f"{self.minute:%H:%M} {self.tool_ref} {self.status}: {self.calls}"


class StreamTicketQuerySet(models.QuerySet["StreamTicket"]):
    def issue(
        self,
        tenant: Tenant,
        principal: str,
        user_id: int,
        run_id: str,
        api_key: ApiKey | None = None,
        session_key: str = "",
    ) -> tuple[StreamTicket, str]:
        raw = secrets.token_urlsafe(32)
        ticket = self.create(
            tenant=tenant,
            principal=principal,
            user_id=user_id,
            api_key=api_key,
            session_key=session_key,
            run_id=run_id,
            token_hash=hashlib.sha256(raw.encode()).hexdigest(),
            expires_at=timezone.now() + STREAM_TICKET_TTL,
        )
        return ticket, raw

    def redeem(self, raw: str) -> StreamTicket | None:
        """The ticket, marked used, if it was unused, unexpired, and its key (if issued
        under one) is not revoked or its session (if issued under one) has not ended;
        else None (single use). The session key it was issued under is handed back on the
        ticket and erased from the row as it is spent: the open stream keeps it in memory,
        and the table holds no second copy of a live session's key."""
        if not raw or len(raw) > 100:
            return None
        digest = hashlib.sha256(raw.encode()).hexdigest()
        now = timezone.now()
        redeemable = (
            self.filter(token_hash=digest, used_at__isnull=True, expires_at__gt=now)
            .filter(models.Q(api_key=None) | models.Q(api_key__revoked_at=None))
            .filter(
                models.Q(session_key="")
                | models.Q(
                    session_key__in=Session.objects.filter(expire_date__gt=now).values(
                        "session_key"
                    )
                )
            )
        )
        ticket = redeemable.select_related("tenant").first()
        if ticket is None:
            return None
        # Spent only if still redeemable (unused: of two handshakes racing with one ticket,
        # one wins; its key and session still valid), in one UPDATE.
        if not redeemable.filter(pk=ticket.pk).update(used_at=now, session_key=""):
            return None
        ticket.used_at = now
        return ticket

    def forget_sessions(self) -> int:
        """Erase the session key of every ticket past its expiry (never redeemed): a
        ticket that can no longer open a stream needs none. Run by the sweeper."""
        return (
            self.filter(expires_at__lte=timezone.now())
            .exclude(session_key="")
            .update(session_key="")
        )


STREAM_TICKET_TTL = timedelta(seconds=60)


class StreamTicket(models.Model):
    """A short-lived, single-use pass to one run's event stream, for clients that
    cannot set headers on a WebSocket handshake (browsers)."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    principal = models.CharField(max_length=160)
    user = models.ForeignKey("auth.User", on_delete=models.CASCADE, related_name="+")
    # The key it was issued under: revoking the key voids its unused tickets.
    api_key = models.ForeignKey(
        "tenants.ApiKey", null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    # The staff session it was issued under (no key): its stream is re-checked against
    # that session and user while open, like the session's own streams.
    session_key = models.CharField(max_length=40, blank=True, default="")
    run_id = models.CharField(max_length=128)
    token_hash = models.CharField(max_length=64, unique=True)
    expires_at = models.DateTimeField()
    used_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = StreamTicketQuerySet.as_manager()

    class Meta:
        indexes = [
            # The expired tickets that still hold a session key: what forget_sessions reads.
            models.Index(
                fields=["expires_at"],
                condition=~models.Q(session_key=""),
                name="tickets_holding_session_idx",
            )
        ]

    def __str__(self) -> str:
        return f"ticket for {self.run_id} ({self.principal})"
