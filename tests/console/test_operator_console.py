"""Issue 12 item 5: the operator console says more at a glance and keeps the operator's work."""

from __future__ import annotations

import json
import re

import pytest
from django.test import Client
from django.utils.html import escape

from apps.approvals import decisions
from apps.approvals.models import ApprovalStatus
from tests.approvals.support import CONFIRM, ECHO, drain_queue, hold, require_approval

pytestmark = pytest.mark.django_db(transaction=True)


def detail_url(approval) -> str:
    return f"/console/approvals/{approval.pk}/"


def test_it_summarises_each_queued_calls_arguments_in_its_row(caller, console):
    require_approval(caller.tenant, ECHO)
    hold(caller, ECHO, args={"text": "refund order 1234", "secret_note": ""})

    rows = console.get("/console/queue/rows/").content.decode()

    assert escape('text: "refund order 1234", secret_note: ""') in rows


def test_it_cuts_a_long_argument_short_in_the_summary(caller, console):
    require_approval(caller.tenant, ECHO)
    hold(caller, ECHO, args={"text": "x" * 500})

    summary = re.search(
        r'class="args-summary[^"]*"[^>]*>([^<]*)<', console.get("/console/").content.decode()
    )

    assert summary is not None
    assert "xxx…, secret_note" in summary.group(1)
    assert summary.group(1).count("x") < 50


def test_the_page_title_and_the_rows_fragment_carry_the_pending_count(caller, console):
    hold(caller, CONFIRM)
    hold(caller, CONFIRM)

    page = console.get("/console/").content.decode()
    rows = console.get("/console/queue/rows/")

    assert "<title>(2) Pending calls · toolhub</title>" in page
    assert rows["X-Pending-Count"] == "2"


def test_an_empty_queue_has_no_count_in_its_title(caller, console):
    page = console.get("/console/").content.decode()

    assert "<title>Pending calls · toolhub</title>" in page
    assert console.get("/console/queue/rows/")["X-Pending-Count"] == "0"


def test_the_live_queue_is_an_aria_live_region(caller, console):
    page = console.get("/console/").content.decode()

    assert re.search(r'<tbody id="queue-rows" aria-live="polite"', page)
    assert re.search(r'id="pending-count" aria-live="polite"', page)


def test_after_approval_the_detail_page_shows_the_calls_result(caller, operator, console):
    require_approval(caller.tenant, ECHO)
    _, approval = hold(caller, ECHO, args={"text": "hello"})
    decisions.decide(approval.pk, operator, "approve")

    waiting = console.get(detail_url(approval)).content.decode()
    drain_queue()
    done = console.get(detail_url(approval)).content.decode()
    fragment = console.get(f"{detail_url(approval)}outcome/").content.decode()

    assert 'id="outcome-waiting"' in waiting
    assert 'data-final="false"' in waiting
    assert escape(json.dumps({"text": "hello", "secret_note": ""}, indent=2)) in done
    assert 'data-final="true"' in done
    assert 'id="outcome-result"' in fragment


def test_after_rejection_the_detail_page_shows_the_error_the_agent_got(caller, operator, console):
    _, approval = hold(caller, CONFIRM)
    decisions.decide(approval.pk, operator, "reject", "Not today.")

    page = console.get(detail_url(approval)).content.decode()

    assert '<code id="outcome-error">approval_rejected</code>' in page
    assert '<p id="outcome-message">Not today.</p>' in page


def test_the_outcome_fragment_is_not_shown_to_other_tenants_operators(caller, other, console):
    _, theirs = hold(other, CONFIRM)

    assert console.get(f"{detail_url(theirs)}outcome/").status_code == 404


def test_the_edits_table_shows_json_not_python_reprs(caller, operator, console):
    require_approval(caller.tenant, ECHO)
    _, approval = hold(caller, ECHO, args={"text": "hello", "secret_note": "n"})
    decisions.decide(approval.pk, operator, "approve", args={"text": "bye", "secret_note": "n"})

    page = console.get(detail_url(approval)).content.decode()
    edits = page.split("<h2>Edits</h2>")[1].split("</table>")[0]

    assert escape('"hello"') in edits
    assert escape('"bye"') in edits
    assert "&#x27;" not in edits  # no Python quoting


def test_an_edit_the_schema_refuses_keeps_the_operators_text(caller, console):
    require_approval(caller.tenant, ECHO)
    _, approval = hold(caller, ECHO, args={"text": "hello"})
    typed = '{"text": 12345, "secret_note": "my careful edit"}'

    response = console.post(detail_url(approval), {"action": "edit", "args": typed})

    assert response.status_code == 400
    page = response.content.decode()
    assert escape(typed) in page
    assert "Invalid arguments" in page
    assert '<details id="edit-args" open' in page
    assert approval.__class__.objects.get(pk=approval.pk).status == ApprovalStatus.PENDING


def test_the_detail_page_pretty_prints_non_ascii_arguments_as_json(caller, console):
    require_approval(caller.tenant, ECHO)
    _, approval = hold(caller, ECHO, args={"text": "grüße"})

    page = console.get(detail_url(approval)).content.decode()

    assert escape('{\n  "text": "grüße"') in page


def test_the_admin_is_branded_toolhub(operator):
    client = Client()
    client.force_login(operator)

    page = client.get("/admin/").content.decode()

    assert "<title>Tenants, tools, policies and records | toolhub admin</title>" in page
    assert '<div id="site-name"><a href="/admin/">toolhub admin</a></div>' in page
    assert "Django administration" not in page


def test_the_history_shows_decision_times_with_seconds(caller, operator, console):
    _, approval = hold(caller, CONFIRM)
    decisions.decide(approval.pk, operator, "reject", "no")
    approval.refresh_from_db()
    assert approval.decided_at is not None

    page = console.get("/console/history/").content.decode()

    assert approval.decided_at.strftime("%Y-%m-%d %H:%M:%S") in page
