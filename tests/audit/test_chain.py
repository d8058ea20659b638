"""Issue 48, 3: every record and event is chained per tenant; verify_audit names the
first broken link (an edited record, a deleted event, a tampered head)."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.db.models.expressions import RawSQL
from django.utils import timezone

from apps.audit import chain, digests
from apps.audit.models import CURRENT, AuditEntry, AuditHead, AuditPending, Kind, Op, link_v2
from apps.audit.verify import chain_began
from apps.invocations.models import InvocationRecord, RunEvent
from tests.audit.support import calls, triggers_off, verify_audit

pytestmark = pytest.mark.django_db


def sql(statement: str, params: list[str]) -> None:
    with connection.cursor() as cursor:
        cursor.execute(statement, params)


def test_each_write_of_a_call_is_linked_as_it_is_written(caller):
    (invocation,) = calls(caller, "run-linked")
    record = InvocationRecord.objects.get(pk=invocation)
    # No sweeper pass: the call's writes are in the chain already, in order.
    assert not AuditPending.objects.exists()
    entries = list(AuditEntry.objects.filter(tenant=caller.tenant).order_by("n"))
    kinds = [(e.kind, e.op) for e in entries]
    assert (Kind.RECORD, Op.INSERT) in kinds
    assert kinds.count((Kind.EVENT, Op.INSERT)) == 2  # tool_call_start and tool_call_result
    assert [e.n for e in entries] == list(range(1, len(entries) + 1))
    assert {e.v for e in entries} == {CURRENT}
    assert any(
        e.kind == Kind.RECORD and e.row_id in (record.pk.hex, str(record.pk)) for e in entries
    )
    head = AuditHead.objects.get(tenant=caller.tenant)
    assert (head.n, head.link) == (entries[-1].n, entries[-1].link)
    # The database's link (SQL) is the one Python recomputes.
    previous = "0" * 64
    for entry in entries:
        assert entry.link == link_v2(
            previous, entry.n, entry.kind, entry.row_id, entry.op, entry.digest, entry.at
        )
        previous = entry.link
    code, out = verify_audit()
    assert code == 0, out
    assert f"acme: OK, {len(entries)} entries #1..#{len(entries)}" in out


def test_a_receipt_edited_in_the_database_is_named(caller):
    _, edited = calls(caller, "run-receipt", 2)
    assert verify_audit()[0] == 0
    record = InvocationRecord.objects.get(pk=edited)
    assert record.receipt
    forged = record.receipt[:-4] + ("AAAA" if not record.receipt.endswith("AAAA") else "BBBB")
    InvocationRecord.objects.filter(pk=edited).update(receipt=forged)
    code, out = verify_audit()
    assert code == 1
    assert f"record {edited} (invocations_invocationrecord) was changed after it ended" in out


def test_a_receipt_edited_with_the_triggers_off_is_named(caller):
    (edited,) = calls(caller, "run-receipt-off")
    with triggers_off():
        InvocationRecord.objects.filter(pk=edited).update(receipt="e30.e30.forged")
    code, out = verify_audit()
    assert code == 1
    assert f"record {edited} (invocations_invocationrecord) differs from its last entry" in out


def test_a_trace_context_kept_after_the_call_is_chained_not_an_edit(caller):
    """/mcp/ keeps the caller's traceparent once the call has returned: chained as an
    update; changing it afterwards is an edit."""
    (invocation,) = calls(caller, "run-traced")
    trace = "00-" + "1" * 32 + "-" + "2" * 16 + "-01"
    InvocationRecord.objects.filter(pk=invocation, traceparent="").update(traceparent=trace)
    last = AuditEntry.objects.filter(tenant=caller.tenant).order_by("-n").first()
    assert last is not None and (last.kind, last.op) == (Kind.RECORD, Op.UPDATE)
    assert verify_audit()[0] == 0
    InvocationRecord.objects.filter(pk=invocation).update(traceparent=trace.replace("1", "3"))
    code, out = verify_audit()
    assert code == 1
    assert f"record {invocation} (invocations_invocationrecord) was changed after it ended" in out


def test_entries_linked_under_version_1_still_verify(caller):
    """Pending entries of the version 1 triggers (digest without the receipt, linked by
    the sweeper) verify beside the version 2 ones that follow them."""
    with triggers_off():
        (old,) = calls(caller, "run-v1")
    vendor = connection.vendor
    table = connection.ops.quote_name(InvocationRecord._meta.db_table)
    digest = (
        InvocationRecord.objects.filter(pk=old)
        .annotate(d=RawSQL(digests.record_digest(vendor, table, v=1), ()))  # noqa: S611
        .values_list("d", flat=True)
        .get()
    )
    row_id = uuid.UUID(old).hex if vendor == "sqlite" else old
    AuditPending.objects.create(
        tenant=caller.tenant,
        kind=Kind.RECORD,
        row_id=row_id,
        run_id="run-v1",
        op=Op.INSERT,
        digest=digest,
        at=timezone.now(),
    )
    for event in RunEvent.objects.filter(tenant=caller.tenant, run_id="run-v1"):
        events = connection.ops.quote_name(RunEvent._meta.db_table)
        event_digest = (
            RunEvent.objects.filter(pk=event.pk)
            .annotate(d=RawSQL(digests.event_digest(vendor, events, v=1), ()))  # noqa: S611
            .values_list("d", flat=True)
            .get()
        )
        AuditPending.objects.create(
            tenant=caller.tenant,
            kind=Kind.EVENT,
            row_id=str(event.pk),
            run_id="run-v1",
            event_seq=event.seq,
            op=Op.INSERT,
            digest=event_digest,
            at=timezone.now(),
        )
    assert chain.link_pending() == 3
    calls(caller, "run-v2")
    versions = list(
        AuditEntry.objects.filter(tenant=caller.tenant).order_by("n").values_list("v", flat=True)
    )
    assert versions[:3] == [1, 1, 1] and set(versions[3:]) == {CURRENT}
    code, out = verify_audit()
    assert code == 0, out
    # A version 1 entry's row is compared under version 1's digest: an edit still shows.
    with triggers_off():
        InvocationRecord.objects.filter(pk=old).update(safe_message="forged")
    code, out = verify_audit()
    assert code == 1 and f"record {old} (invocations_invocationrecord) differs" in out


def test_rows_written_before_the_chain_are_counted_not_a_break(caller):
    """Rows older than the audit migration have no entry: a note with their count and
    range, the chain still verifies."""
    began = chain_began()
    assert began is not None
    with triggers_off():
        before = calls(caller, "run-before", 2)
        InvocationRecord.objects.filter(pk__in=before).update(created_at=began - timedelta(days=2))
        RunEvent.objects.filter(tenant=caller.tenant, run_id="run-before").update(
            at=began - timedelta(days=1)
        )
    calls(caller, "run-after")
    code, out = verify_audit()
    assert code == 0, out
    day = (began - timedelta(days=2)).date().isoformat()
    assert "acme: 2 records and 4 events written before the chain began" in out, out
    assert f"(from {day}" in out
    assert "not chained" in out


def test_a_record_edited_with_raw_sql_is_named(caller):
    _, edited, _ = calls(caller, "run-edited", 3)
    assert verify_audit()[0] == 0
    table = InvocationRecord._meta.db_table
    sql(
        f"UPDATE {table} SET result = %s WHERE id = %s",  # noqa: S608 (a name, not a value)
        [
            '{"text": "forged"}',
            edited.replace("-", "") if connection.vendor == "sqlite" else edited,
        ],
    )
    code, out = verify_audit("--tenant", "acme")
    assert code == 1
    assert f"record {edited} (invocations_invocationrecord) was changed after it ended" in out
    assert "BROKEN" in out


def test_a_record_edited_with_its_trigger_off_is_named(caller):
    """The triggers dropped first (an owner of the database can): the row no longer
    matches its last entry."""
    (edited,) = calls(caller, "run-untriggered")
    with triggers_off():
        InvocationRecord.objects.filter(pk=edited).update(safe_message="nothing happened")
    code, out = verify_audit()
    assert code == 1
    assert f"record {edited} (invocations_invocationrecord) differs from its last entry" in out


def test_an_event_deleted_from_the_middle_of_a_run_is_named(caller):
    calls(caller, "run-holed", 3)
    middle = RunEvent.objects.get(tenant=caller.tenant, run_id="run-holed", seq=3)
    RunEvent.objects.filter(pk=middle.pk).delete()
    code, out = verify_audit()
    assert code == 1
    assert f"event {middle.pk} (invocations_runevent: run run-holed #3) was deleted" in out


def test_an_entry_deleted_from_the_chain_and_entries_swapped_are_named(caller):
    calls(caller, "run-chain", 2)
    AuditEntry.objects.filter(tenant=caller.tenant, n=3).delete()
    code, out = verify_audit()
    assert code == 1
    assert "positions #3..#3 missing: entries deleted from the chain" in out


def test_two_entries_swapped_break_the_link(caller):
    calls(caller, "run-swapped", 2)
    two, three = (AuditEntry.objects.get(tenant=caller.tenant, n=n) for n in (2, 3))
    for entry, row_id, digest in (
        (two, three.row_id, three.digest),
        (three, two.row_id, two.digest),
    ):
        AuditEntry.objects.filter(pk=entry.pk).update(row_id=row_id, digest=digest)
    code, out = verify_audit()
    assert code == 1
    assert "#2: the link of" in out and "does not follow from #1" in out


def test_a_tampered_head_is_named(caller):
    calls(caller, "run-head", 2)
    head = AuditHead.objects.get(tenant=caller.tenant)
    AuditHead.objects.filter(pk=head.pk).update(link="f" * 64)
    code, out = verify_audit()
    assert code == 1
    assert f"#{head.n}: the head's link differs from #{head.n}'s: the head row was edited" in out
    AuditHead.objects.filter(pk=head.pk).update(link=head.link, n=head.n - 1)
    code, out = verify_audit()
    assert code == 1
    assert "the head row was edited" in out


def test_the_chain_goes_on_from_a_tampered_head_and_breaks_there(caller):
    """A head changed between two passes: the next entry is linked from the forged link,
    and no longer follows from the entry before it."""
    calls(caller, "run-forged", 1)
    head = AuditHead.objects.get(tenant=caller.tenant)
    AuditHead.objects.filter(pk=head.pk).update(link="0" * 63 + "1")
    calls(caller, "run-forged", 1)
    code, out = verify_audit()
    assert code == 1
    assert f"#{head.n + 1}: the link of" in out


def test_tenants_have_chains_of_their_own(caller, other):
    calls(caller, "run-a", 2)
    calls(other, "run-b", 1)
    acme = AuditEntry.objects.filter(tenant=caller.tenant).count()
    globex = AuditEntry.objects.filter(tenant=other.tenant).count()
    assert acme > globex > 0
    code, out = verify_audit()
    assert code == 0, out
    assert f"acme: OK, {acme} entries" in out and f"globex: OK, {globex} entries" in out


def test_since_starts_at_an_instant_and_refuses_nonsense(caller):
    calls(caller, "run-since", 2)
    third = AuditEntry.objects.get(tenant=caller.tenant, n=3)
    code, out = verify_audit("--since", third.at.isoformat())
    assert code == 0, out
    first = min(e.n for e in AuditEntry.objects.filter(tenant=caller.tenant) if e.at >= third.at)
    assert f"entries #{first}..#" in out
    assert verify_audit("--since", "yesterday")[1].endswith(
        "is not an ISO 8601 instant with a time zone (e.g. 2026-11-01T00:00:00Z)."
    )
    assert "No tenant 'nobody'." in verify_audit("--tenant", "nobody")[1]
