"""manage.py prune: what leaves, what stays, what is left behind (tombstones, marks, 410s)."""

from __future__ import annotations

import re

import pytest
from django.core.exceptions import ValidationError
from django.core.management import CommandError, call_command
from django.db import IntegrityError, transaction

from apps.approvals.models import ApprovalRequest
from apps.invocations.models import InvocationRecord, RunEvent, Status, StreamTicket
from apps.retention.models import PrunedId, PrunedRun, PruneMark, RetentionPolicy
from tests.approvals.support import CONFIRM, hold, logged_in, post_decision
from tests.retention.support import age, call, keep_for, prune, seqs

pytestmark = pytest.mark.django_db(transaction=True)


# ---------------------------------------------------------------- retention days


@pytest.mark.parametrize("days", [0, -1, -365])
def test_a_retention_of_zero_or_negative_days_is_refused_with_a_clear_message(agent, days):
    policy = RetentionPolicy(tenant=agent.tenant, days=days)
    with pytest.raises(ValidationError) as refused:
        policy.full_clean()
    assert "at least 1" in str(refused.value)
    with pytest.raises(CommandError, match="at least 1"):
        call_command("set_retention", agent.tenant.slug, str(days))
    assert not RetentionPolicy.objects.exists()


def test_the_database_refuses_zero_days_written_past_the_validation(agent):
    with pytest.raises(IntegrityError), transaction.atomic():
        RetentionPolicy.objects.create(tenant=agent.tenant, days=0)


def test_set_retention_sets_days_and_default(agent):
    call_command("set_retention", agent.tenant.slug, "30")
    assert RetentionPolicy.objects.get(tenant=agent.tenant).days == 30
    call_command("set_retention", agent.tenant.slug, "default")
    assert RetentionPolicy.objects.get(tenant=agent.tenant).days is None


def test_without_a_retention_nothing_is_pruned(agent):
    old = call(agent, "run-old", 2)
    age(old, 400)

    printed = prune()

    assert "acme: kept forever" in printed
    assert InvocationRecord.objects.count() == 2


def test_the_deployment_default_applies_to_tenants_without_their_own(agent, settings):
    settings.TOOLHUB_RETENTION_DAYS = 30
    old = call(agent, "run-old", 2)
    age(old, 31)

    prune()

    assert not InvocationRecord.objects.exists()


# ---------------------------------------------------------------- what leaves


def test_old_finished_calls_leave_with_their_events_and_recent_ones_stay(agent):
    keep_for(agent.tenant, 30)
    old = call(agent, "run-a", 3)
    recent = call(agent, "run-b", 2)
    age(old, 31)

    printed = prune()

    assert set(map(str, InvocationRecord.objects.values_list("pk", flat=True))) == set(recent)
    assert seqs(agent.tenant, "run-a") == []
    assert seqs(agent.tenant, "run-b") == [1, 2, 3, 4]
    mark = PruneMark.objects.get()
    assert (mark.records, mark.events) == (3, 6)
    assert PrunedId.objects.filter(kind="record").count() == 3
    assert PrunedRun.objects.get(run_id="run-a").through_seq == 6
    assert "acme: deleted 3 records, 6 events" in printed
    assert "deleted 3 records, 6 events, 0 approvals" in printed


def test_a_dry_run_deletes_nothing_and_says_what_it_would_delete(agent, staff):
    keep_for(agent.tenant, 30)
    age(call(agent, "run-a", 3), 31)
    StreamTicket.objects.issue(agent.tenant, agent.principal, staff.pk, "run-a")
    StreamTicket.objects.update(expires_at="2020-01-01T00:00:00Z")

    printed = prune("--dry-run")

    assert "acme: would delete 3 records, 6 events" in printed
    assert "would delete 1" in printed
    assert InvocationRecord.objects.count() == 3
    assert RunEvent.objects.count() == 6
    assert StreamTicket.objects.count() == 1
    assert not PruneMark.objects.exists()


def test_small_batches_delete_everything_in_several_transactions(agent):
    keep_for(agent.tenant, 30)
    age(call(agent, "run-a", 7), 31)

    printed = prune("--batch", "2")

    assert not InvocationRecord.objects.exists()
    progress = re.findall(r"acme: deleted (\d+) records, (\d+) events", printed)
    assert progress == [("2", "4"), ("4", "8"), ("6", "12"), ("7", "14")]
    assert PruneMark.objects.count() == 1  # one pass: its chunks do not wait for each other
    assert "acme: deleted 7 records, 14 events" in printed


def test_a_batch_of_zero_is_refused(agent):
    with pytest.raises(CommandError, match="at least 1"):
        prune("--batch", "0")


def test_only_the_named_tenant_is_pruned(agent, stranger):
    keep_for(agent.tenant, 30)
    keep_for(stranger.tenant, 30)
    age(call(agent, "run-a", 1) + call(stranger, "run-g", 1), 31)

    prune("--tenant", "globex")

    assert list(InvocationRecord.objects.values_list("tenant__slug", flat=True)) == ["acme"]


def test_an_unknown_tenant_is_refused(agent):
    with pytest.raises(CommandError, match="No tenant 'nobody'"):
        prune("--tenant", "nobody")


def test_expired_stream_tickets_are_deleted_and_live_ones_kept(agent, staff):
    StreamTicket.objects.issue(agent.tenant, agent.principal, staff.pk, "run-a")
    StreamTicket.objects.issue(agent.tenant, agent.principal, staff.pk, "run-b")
    StreamTicket.objects.filter(run_id="run-a").update(expires_at="2020-01-01T00:00:00Z")

    prune()

    assert list(StreamTicket.objects.values_list("run_id", flat=True)) == ["run-b"]


# ---------------------------------------------------------------- what stays


def test_an_unfinished_call_stays_with_its_events_and_every_later_event_of_its_run(agent):
    keep_for(agent.tenant, 30)
    first = call(agent, "run-a", 1)
    stuck = call(agent, "run-a", 1)
    after = call(agent, "run-a", 1)
    age(first + stuck + after, 31)
    InvocationRecord.objects.filter(pk=stuck[0]).update(status=Status.RUNNING)

    prune()

    remaining = set(map(str, InvocationRecord.objects.values_list("pk", flat=True)))
    assert remaining == {stuck[0], after[0]}
    # The run's events leave as a prefix: the first call's, up to the stuck call's.
    assert seqs(agent.tenant, "run-a") == [3, 4, 5, 6]
    assert PrunedRun.objects.get(run_id="run-a").through_seq == 2


def test_a_held_call_and_its_pending_approval_stay(caller):
    keep_for(caller.tenant, 30)
    body, approval = hold(caller, CONFIRM, runId="run-held")
    age([body["invocationId"]], 31)

    prune()

    assert ApprovalRequest.objects.filter(pk=approval.pk).exists()
    assert InvocationRecord.objects.filter(pk=body["invocationId"]).exists()


def test_a_decided_approval_leaves_with_its_call_and_answers_410(caller, operator):
    keep_for(caller.tenant, 30)
    body, approval = hold(caller, CONFIRM, runId="run-held")
    client = logged_in(operator)
    assert post_decision(client, approval.pk, "reject", reason="no").status_code == 200
    age([body["invocationId"]], 31)

    prune()

    assert not ApprovalRequest.objects.exists()
    response = client.get(f"/api/v1/approvals/{approval.pk}/")
    assert response.status_code == 410, response.content
    assert response.json()["detail"].startswith("Gone: pruned on ")
    assert "approvals created before" in response.json()["detail"]
    page = client.get(f"/console/approvals/{approval.pk}/")
    assert page.status_code == 410
    assert "pruned on" in page.content.decode()


# ---------------------------------------------------------------- 410 for pruned records


def test_a_pruned_record_answers_410_saying_when_and_what(agent):
    keep_for(agent.tenant, 30)
    old = call(agent, "run-a", 1)
    age(old, 31)
    prune()
    mark = PruneMark.objects.get()

    response = agent.client.get(f"/api/v1/invocations/{old[0]}/")

    assert response.status_code == 410, response.content
    body = response.json()
    assert body["prunedAt"] == mark.pruned_at.isoformat().replace("+00:00", "Z")
    assert body["prunedBefore"] == mark.before.isoformat().replace("+00:00", "Z")
    assert body["detail"] == f"Gone: {mark.describe()} (retention)."
    assert agent.client.post(f"/api/v1/invocations/{old[0]}/cancel/").status_code == 410


def test_another_tenant_gets_404_for_a_pruned_record_not_410(agent, stranger):
    keep_for(agent.tenant, 30)
    old = call(agent, "run-a", 1)
    age(old, 31)
    prune()

    assert stranger.client.get(f"/api/v1/invocations/{old[0]}/").status_code == 404


def test_an_id_never_seen_is_still_404(agent):
    response = agent.client.get("/api/v1/invocations/00000000-0000-4000-8000-000000000000/")
    assert response.status_code == 404
