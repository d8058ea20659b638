"""Issue 12 item 4: records staff can search and follow (record ↔ events ↔ approval ↔
policy ↔ connection), times with seconds, JSON pretty-printed, and a run timeline."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils.html import escape

from apps.invocations.models import InvocationRecord, RunEvent
from apps.tenants.roles import Role, grant_role
from tests.approvals.support import CONFIRM, ECHO, hold, make_operator, require_approval

pytestmark = pytest.mark.django_db(transaction=True)

RECORDS = "/admin/invocations/invocationrecord/"
EVENTS = "/admin/invocations/runevent/"
APPROVALS = "/admin/approvals/approvalrequest/"


def staff(operator: User) -> Client:
    """The operator, with the operator role's view permissions on records and events."""
    for tenant in operator.tenants.all():
        grant_role(operator, tenant, Role.OPERATOR)
    client = Client()
    client.force_login(operator)
    return client


def two_calls(caller):
    first = caller.invoke(ECHO, args={"text": "one"}, toolCallId="call-one", runId="run-a").json()
    second = caller.invoke(ECHO, args={"text": "two"}, toolCallId="call-two", runId="run-b").json()
    return first, second


def test_records_are_found_by_invocation_id(caller, operator):
    first, second = two_calls(caller)

    page = staff(operator).get(RECORDS, {"q": first["invocationId"]}).content.decode()

    assert f"{first['invocationId']}/change/" in page
    assert f"{second['invocationId']}/change/" not in page


@pytest.mark.parametrize("term", ["call-one", "run-a"])
def test_records_are_found_by_tool_call_or_run_id(caller, operator, term):
    first, second = two_calls(caller)

    page = staff(operator).get(RECORDS, {"q": term}).content.decode()

    assert f"{first['invocationId']}/change/" in page
    assert f"{second['invocationId']}/change/" not in page


def test_a_search_never_shows_another_tenants_record(caller, other, operator):
    theirs = other.invoke(ECHO, args={"text": "x"}, toolCallId="call-one", runId="run-a").json()

    page = staff(operator).get(RECORDS, {"q": theirs["invocationId"]}).content.decode()

    assert f"{theirs['invocationId']}/change/" not in page


def test_events_are_found_by_run_id(caller, operator):
    two_calls(caller)

    page = staff(operator).get(EVENTS, {"q": "run-a"}).content.decode()

    assert "call-one" in page
    assert "call-two" not in page


def test_approvals_are_found_by_invocation_id(caller, operator):
    held, approval = hold(caller, CONFIRM, runId="run-held")

    page = staff(operator).get(APPROVALS, {"q": held["invocationId"]}).content.decode()

    assert f"{approval.pk}/change/" in page


def test_record_times_show_seconds(caller, operator):
    first, _ = two_calls(caller)
    record = InvocationRecord.objects.get(pk=first["invocationId"])

    page = staff(operator).get(RECORDS).content.decode()

    assert record.created_at.strftime("%Y-%m-%d %H:%M:%S") in page


def test_a_record_links_its_timeline_events_approval_and_policy(caller, operator):
    policy = require_approval(caller.tenant, ECHO)
    held, approval = hold(caller, ECHO, args={"text": "hi"}, runId="run-held")

    page = staff(operator).get(f"{RECORDS}{held['invocationId']}/change/").content.decode()

    assert escape("/console/runs/run-held/?tenant=acme") in page
    assert escape(f"{EVENTS}?run_id=run-held&tenant__id__exact={caller.tenant.pk}") in page
    assert f"{APPROVALS}{approval.pk}/change/" in page
    assert f"/console/approvals/{approval.pk}/" in page
    assert f"/admin/policies/policy/{policy.pk}/change/" in page


def test_a_record_shows_its_arguments_as_pretty_json(caller, operator):
    first, _ = two_calls(caller)

    page = staff(operator).get(f"{RECORDS}{first['invocationId']}/change/").content.decode()

    assert '<pre class="toolhub-json">{\n  &quot;text&quot;: &quot;one&quot;\n}</pre>' in page


def test_an_event_shows_its_message_as_pretty_json_and_links_its_record(caller, operator):
    first, _ = two_calls(caller)
    event = RunEvent.objects.filter(run_id="run-a").order_by("seq").first()
    assert event is not None

    page = staff(operator).get(f"{EVENTS}{event.pk}/change/").content.decode()

    assert escape('{\n  "v": 1,') in page
    assert f"{RECORDS}{first['invocationId']}/change/" in page


def test_an_approval_in_the_admin_links_its_record_and_shows_pretty_args(caller, operator):
    require_approval(caller.tenant, ECHO)
    held, approval = hold(caller, ECHO, args={"text": "hi"}, runId="run-held")

    page = staff(operator).get(f"{APPROVALS}{approval.pk}/change/").content.decode()

    assert f"{RECORDS}{held['invocationId']}/change/" in page
    assert escape('{\n  "text": "hi"') in page
    assert 'name="args"' not in page  # shown, not editable


def test_the_run_timeline_lists_a_runs_events_in_order(caller, operator):
    caller.invoke(ECHO, args={"text": "one"}, toolCallId="c1", runId="run-t")
    caller.invoke(ECHO, args={"text": "two"}, toolCallId="c2", runId="run-t")

    response = staff(operator).get("/console/runs/run-t/")

    assert response.status_code == 200
    page = response.content.decode()
    seqs = [int(s) for s in re.findall(r'<li class="event" data-seq="(\d+)"', page)]
    assert seqs == sorted(seqs) and len(seqs) == 4
    assert page.index('small">c1<') < page.index('small">c2<')
    assert 'data-last-seq="4"' in page
    assert 'aria-live="polite"' in page
    assert "toolhub/timeline.js" in page


def test_the_run_timeline_is_404_for_another_tenants_run(caller, other, operator):
    other.invoke(ECHO, args={"text": "x"}, toolCallId="c1", runId="run-theirs")

    assert staff(operator).get("/console/runs/run-theirs/").status_code == 404


def test_staff_of_two_tenants_pick_the_tenant_of_a_shared_run_id(caller, other):
    both = make_operator("bea", caller.tenant, other.tenant)
    caller.invoke(ECHO, args={"text": "mine"}, toolCallId="c1", runId="run-same")
    other.invoke(ECHO, args={"text": "theirs"}, toolCallId="c9", runId="run-same")
    client = staff(both)

    chooser = client.get("/console/runs/run-same/").content.decode()
    chosen = client.get("/console/runs/run-same/", {"tenant": "globex"}).content.decode()

    assert "?tenant=acme" in chooser and "?tenant=globex" in chooser
    assert 'small">c9<' in chosen and 'small">c1<' not in chosen
    assert 'data-tenant="globex"' in chosen


def test_the_console_detail_links_the_run_timeline_and_the_record(caller, operator):
    held, approval = hold(caller, CONFIRM, runId="run-held")

    page = staff(operator).get(f"/console/approvals/{approval.pk}/").content.decode()

    assert escape("/console/runs/run-held/?tenant=acme") in page
    assert f"{RECORDS}{held['invocationId']}/change/" in page


def test_a_record_links_its_connection_while_it_exists(caller, operator):
    from tests.connections import make_connection

    connection = make_connection(caller.tenant, name="crm")
    first, _ = two_calls(caller)
    InvocationRecord.objects.filter(pk=first["invocationId"]).update(
        connection_id=str(connection.pk)
    )
    url = f"{RECORDS}{first['invocationId']}/change/"
    connection_id = connection.pk

    linked = staff(operator).get(url).content.decode()
    connection.delete()
    gone = staff(operator).get(url).content.decode()

    assert f"/admin/connections/connection/{connection_id}/change/" in linked
    assert "connection crm" in linked
    assert f"/admin/connections/connection/{connection_id}/change/" not in gone
    assert str(connection_id) in gone  # the id stays on the record as evidence
