"""Issue 48, 3: every record and event is chained per tenant; verify_audit names the
first broken link (an edited record, a deleted event, a tampered head)."""

from __future__ import annotations

import pytest
from django.db import connection

from apps.audit import chain
from apps.audit.models import AuditEntry, AuditHead, AuditPending, Kind, Op
from apps.invocations.models import InvocationRecord, RunEvent
from tests.audit.support import calls, triggers_off, verify_audit

pytestmark = pytest.mark.django_db


def sql(statement: str, params: list[str]) -> None:
    with connection.cursor() as cursor:
        cursor.execute(statement, params)


def test_each_write_of_a_call_is_journaled_and_linked_in_order(caller):
    (invocation,) = calls(caller, "run-linked")
    record = InvocationRecord.objects.get(pk=invocation)
    pending = list(AuditPending.objects.filter(tenant=caller.tenant).order_by("id"))
    kinds = [(p.kind, p.op) for p in pending]
    assert (Kind.RECORD, Op.INSERT) in kinds
    assert kinds.count((Kind.EVENT, Op.INSERT)) == 2  # tool_call_start and tool_call_result
    assert chain.link_pending() == len(pending)
    assert not AuditPending.objects.exists()
    entries = list(AuditEntry.objects.filter(tenant=caller.tenant).order_by("n"))
    assert [e.n for e in entries] == list(range(1, len(pending) + 1))
    assert any(
        e.kind == Kind.RECORD and e.row_id in (record.pk.hex, str(record.pk)) for e in entries
    )
    head = AuditHead.objects.get(tenant=caller.tenant)
    assert (head.n, head.link) == (entries[-1].n, entries[-1].link)
    code, out = verify_audit()
    assert code == 0, out
    assert f"acme: OK, {len(entries)} entries #1..#{len(entries)}" in out


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
    chain.link_pending()
    with triggers_off():
        InvocationRecord.objects.filter(pk=edited).update(safe_message="nothing happened")
    code, out = verify_audit()
    assert code == 1
    assert f"record {edited} (invocations_invocationrecord) differs from its last entry" in out


def test_an_event_deleted_from_the_middle_of_a_run_is_named(caller):
    calls(caller, "run-holed", 3)
    middle = RunEvent.objects.get(tenant=caller.tenant, run_id="run-holed", seq=3)
    chain.link_pending()
    RunEvent.objects.filter(pk=middle.pk).delete()
    code, out = verify_audit()
    assert code == 1
    assert f"event {middle.pk} (invocations_runevent: run run-holed #3) was deleted" in out


def test_an_entry_deleted_from_the_chain_and_entries_swapped_are_named(caller):
    calls(caller, "run-chain", 2)
    chain.link_pending()
    AuditEntry.objects.filter(tenant=caller.tenant, n=3).delete()
    code, out = verify_audit()
    assert code == 1
    assert "positions #3..#3 missing: entries deleted from the chain" in out


def test_two_entries_swapped_break_the_link(caller):
    calls(caller, "run-swapped", 2)
    chain.link_pending()
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
    chain.link_pending()
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
    chain.link_pending()
    head = AuditHead.objects.get(tenant=caller.tenant)
    AuditHead.objects.filter(pk=head.pk).update(link="0" * 63 + "1")
    calls(caller, "run-forged", 1)
    code, out = verify_audit()
    assert code == 1
    assert f"#{head.n + 1}: the link of" in out


def test_tenants_have_chains_of_their_own(caller, other):
    calls(caller, "run-a", 2)
    calls(other, "run-b", 1)
    chain.link_pending()
    acme = AuditEntry.objects.filter(tenant=caller.tenant).count()
    globex = AuditEntry.objects.filter(tenant=other.tenant).count()
    assert acme > globex > 0
    code, out = verify_audit()
    assert code == 0, out
    assert f"acme: OK, {acme} entries" in out and f"globex: OK, {globex} entries" in out


def test_since_starts_at_an_instant_and_refuses_nonsense(caller):
    calls(caller, "run-since", 2)
    chain.link_pending()
    third = AuditEntry.objects.get(tenant=caller.tenant, n=3)
    code, out = verify_audit("--since", third.at.isoformat())
    assert code == 0, out
    first = min(e.n for e in AuditEntry.objects.filter(tenant=caller.tenant) if e.at >= third.at)
    assert f"entries #{first}..#" in out
    assert verify_audit("--since", "yesterday")[1].endswith(
        "is not an ISO 8601 instant with a time zone (e.g. 2026-11-01T00:00:00Z)."
    )
    assert "No tenant 'nobody'." in verify_audit("--tenant", "nobody")[1]
