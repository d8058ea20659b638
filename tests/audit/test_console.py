"""Issue 48, 5: a call's page in the console says whether the chain verifies up to it."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from apps.audit.models import AuditEntry, AuditHead
from apps.invocations.models import InvocationRecord
from tests.approvals.support import CONFIRM, hold
from tests.audit.support import calls, triggers_off

pytestmark = pytest.mark.django_db


@pytest.fixture
def console(db: None) -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("root", password="pw-root-12345"))
    return client


def chain_cell(console: Client, invocation: str) -> str:
    url = reverse("admin:invocations_invocationrecord_change", args=[invocation])
    page = console.get(url).content.decode()
    start = page.index('<span class="toolhub-audit')
    end = page.index("</span>", page.index('id="chain-text"', start))
    return page[start:end]


def last_entry(invocation: str) -> int:
    record = InvocationRecord.objects.get(pk=invocation)
    return max(
        AuditEntry.objects.filter(row_id__in=(record.pk.hex, str(record.pk))).values_list(
            "n", flat=True
        )
    )


def test_a_call_page_says_the_chain_verifies_up_to_it(caller, console):
    first, second = calls(caller, "run-console", 2)
    cell = chain_cell(console, first)
    assert "toolhub-audit-verified" in cell and "verifies up to this call" in cell
    # The walk went as far as the call's last entry, and is remembered for the next page.
    assert AuditHead.objects.get(tenant=caller.tenant).verified_n == last_entry(first)
    assert "verifies up to this call" in chain_cell(console, second)
    assert AuditHead.objects.get(tenant=caller.tenant).verified_n == last_entry(second)


def test_a_call_page_says_when_its_record_was_edited(caller, console):
    (invocation,) = calls(caller, "run-console-edited")
    InvocationRecord.objects.filter(pk=invocation).update(safe_message="forged")
    cell = chain_cell(console, invocation)
    assert "toolhub-audit-broken" in cell and "changed after it ended" in cell


def test_a_call_after_a_break_is_not_shown_as_verified(caller, console):
    _, second = calls(caller, "run-console-break", 2)
    AuditEntry.objects.filter(tenant=caller.tenant, n=2).update(digest="0" * 64)
    cell = chain_cell(console, second)
    assert "toolhub-audit-broken" in cell and "The chain breaks before this call: #2" in cell


def test_a_call_page_shows_its_receipt(caller, console):
    (invocation,) = calls(caller, "run-console-receipt")
    url = reverse("admin:invocations_invocationrecord_change", args=[invocation])
    page = console.get(url).content.decode()
    assert 'id="receipt-valid">signature valid' in page
    assert 'id="receipt-body"' in page and invocation in page  # the signed body, shown
    assert 'id="chain-state">verified' in page


def test_an_approval_page_says_whether_the_chain_verifies_up_to_its_call(caller, operator):
    approvals = Client()
    approvals.force_login(operator)
    _, approval = hold(caller, CONFIRM, runId="run-console-approval")
    page = approvals.get(reverse("console:detail", args=[approval.pk])).content.decode()
    assert 'id="chain-state">verified' in page
    record = InvocationRecord.objects.get(pk=approval.invocation_id)
    with triggers_off():
        InvocationRecord.objects.filter(pk=record.pk).update(principal="agent:forged")
    page = approvals.get(reverse("console:detail", args=[approval.pk])).content.decode()
    assert 'id="chain-state">broken' in page
    assert "This record differs from its chain entry" in page
