"""Issue 48, 5: a call's pages (its record in the admin, its approval in the console) show
its receipt and whether the audit chain verifies up to it, at desktop width and at 390 px,
in a real browser against a real Daphne."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect

from apps.invocations.models import InvocationRecord
from tests.audit.support import triggers_off
from tests.browser.conftest import OPERATOR_PASSWORD
from tests.browser.test_operator_console import SERVER_ENV, log_in, screenshot
from tests.conftest import allow, make_agent
from tests.support.http import api
from tests.support.server import daphne

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.one_leg("postgresql"),
]

WIDTHS = {"desktop": 1280, "phone": 390}


def fits(page: Page, selector: str, width: int) -> None:
    """The section is on the page and inside its width (nothing to scroll sideways for)."""
    box = page.locator(selector).bounding_box()
    assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= width, box


def test_a_calls_pages_show_its_receipt_and_chain_at_both_widths(test_tools, new_context):
    agent = make_agent("acme")
    allow(agent.tenant, "test__echo", "test__confirm")
    User.objects.create_superuser("auditor", password=OPERATOR_PASSWORD)
    with daphne(SERVER_ENV) as base:
        status, done = api(
            base,
            agent.key,
            "POST",
            "/api/v1/invocations/",
            {"toolId": "test__echo", "runId": "run-audit", "args": {"text": "hi"}},
        )
        assert status == 200, done
        status, held = api(
            base,
            agent.key,
            "POST",
            "/api/v1/invocations/",
            {"toolId": "test__confirm", "runId": "run-audit"},
        )
        assert status == 202, held
        record_page = f"/admin/invocations/invocationrecord/{done['invocationId']}/change/"
        approval_page = f"/console/approvals/{held['approvalId']}/"
        page = new_context(base).new_page()
        log_in(page, "auditor", record_page)
        for name, width in WIDTHS.items():
            page.set_viewport_size({"width": width, "height": 900})
            page.goto(record_page)
            expect(page.locator("#receipt-valid")).to_have_text("signature valid")
            expect(page.locator("#receipt-body")).to_contain_text(done["invocationId"])
            expect(page.locator("#chain-state")).to_have_text("verified")
            expect(page.locator("#chain-text")).to_contain_text("verifies up to this call")
            fits(page, "#receipt", width)
            screenshot(page, f"audit-record-{name}")

            page.goto(approval_page)
            expect(page.locator("#audit-chain #chain-state")).to_have_text("verified")
            fits(page, "#audit-chain", width)
            screenshot(page, f"audit-approval-{name}")

        with triggers_off():
            InvocationRecord.objects.filter(pk=done["invocationId"]).update(safe_message="forged")
        page.goto(record_page)
        expect(page.locator("#chain-state")).to_have_text("broken")
        expect(page.locator("#chain-text")).to_contain_text("differs from its chain entry")
        screenshot(page, "audit-record-broken-phone")
