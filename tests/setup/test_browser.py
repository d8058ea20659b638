"""The setup page, the dry run and the connection form in real Chromium against Daphne.

An admin follows the setup page in the browser; the agent then really calls
core__http_request over HTTP against a local server. Screenshots go to
$TOOLHUB_BROWSER_SCREENSHOTS, or <var dir>/screenshots.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from django.conf import settings
from playwright.sync_api import Page, expect

from apps.policies.models import Outcome, Policy, PolicyRule
from apps.policies.setup import grant_tool
from apps.tools.models import Tool
from tests.connections import HTTP, local_server
from tests.setup.conftest import PASSWORD, build_setting
from tests.support.http import api
from tests.support.server import daphne

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.one_leg("postgresql"),
]

SERVER_ENV = {"DJANGO_ALLOW_ASYNC_UNSAFE": ""}


def screenshot(page: Page, name: str) -> None:
    folder = Path(os.environ.get("TOOLHUB_BROWSER_SCREENSHOTS") or settings.VAR_DIR / "screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(folder / f"setup-{name}.png"), full_page=True)


def log_in(page: Page, username: str, next_path: str) -> None:
    page.goto(f"/admin/login/?next={next_path}")
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    expect(page.locator("#content")).to_be_visible()


def test_following_the_setup_page_in_a_browser_lets_the_agent_call_http_request(new_context):
    setting = build_setting()
    agent = setting.agent
    with local_server() as target, daphne(SERVER_ENV) as base:
        url = f"{target.base}/ok/browser"
        call = {"toolId": HTTP, "args": {"url": url}, "connectionId": str(setting.connection.pk)}
        status, refused = api(base, agent.key, "POST", "/api/v1/invocations/", call)
        assert status == 200 and refused["errorCode"] == "policy_denied", refused

        page = new_context(base).new_page()
        log_in(page, "ada", "/admin/policies/policy/")
        page.click("#link-setup")
        page.fill("#id_principal", agent.principal)
        page.select_option("#id_tool", HTTP)
        page.select_option("#id_connection", label="acme/local")
        screenshot(page, "form")
        page.click("#setup-submit")
        expect(page.locator("#setup-report")).to_contain_text("now allows core__http_request")
        expect(page.locator("#access-tools")).to_contain_text(HTTP)
        expect(page.locator("#access-connections")).to_contain_text(str(setting.connection.pk))
        screenshot(page, "done")

        status, listed = api(base, agent.key, "GET", "/api/v1/connections/")
        assert status == 200
        assert listed == {
            "connections": [{"id": str(setting.connection.pk), "name": "local", "kind": "bearer"}]
        }
        status, result = api(base, agent.key, "POST", "/api/v1/invocations/", call)
        assert status == 200 and result["ok"] is True, result
        assert result["result"]["status"] == 200
        assert target.seen[-1].path == "/ok/browser"


def test_the_dry_run_form_shows_each_checks_verdict_and_the_deciding_rule(new_context):
    setting = build_setting()
    agent = setting.agent
    grant_tool(agent.tenant, agent.principal, Tool.objects.get(pk="core__get_current_time"))
    policy = Policy.objects.get(tenant=agent.tenant, principal=agent.principal)
    rule = PolicyRule.objects.create(
        policy=policy,
        tool_pattern="core__get_current_time",
        condition="args.timezone.startsWith('America/')",
        outcome=Outcome.DENY,
        description="no American time",
    )
    with daphne(SERVER_ENV) as base:
        page = new_context(base).new_page()
        log_in(page, "ada", "/admin/policies/policy/")
        page.click("#link-simulate")
        page.fill("#id_principal", agent.principal)
        page.fill("#id_tool_id", "core__get_current_time")
        page.fill("#id_args", '{"timezone": "America/Chicago"}')
        page.click("#simulate-submit")
        expect(page.locator("#simulation-decision")).to_have_text("Decision: deny")
        expect(page.locator("#simulation-rule")).to_have_text(rule.label)
        expect(page.locator("#simulation-refusal")).to_contain_text("no American time")
        checks = page.locator("#simulation-checks")
        expect(checks).to_contain_text("lookup_tool")
        expect(checks).to_contain_text("check_permission")
        screenshot(page, "dry-run")

        # The rules table and its errors fit a 1280 px screen.
        page.goto(f"/admin/policies/policy/{policy.pk}/change/")
        page.fill("#id_rules-0-condition", "args.timezone ==")
        page.click("input[name=_continue]")
        expect(page.locator("#rules-group .errorlist").first).to_contain_text("does not compile")
        page.locator("#rules-group .errorlist").first.scroll_into_view_if_needed()
        width = page.evaluate("document.documentElement.scrollWidth")
        assert width <= 1280, width
        # The table itself, not only the page: no column scrolled out of its box.
        table = page.locator("#rules-group table")
        fits = table.evaluate(
            "t => t.scrollWidth <= t.parentElement.clientWidth"
            " && t.getBoundingClientRect().right <= window.innerWidth"
        )
        assert fits, table.evaluate("t => [t.scrollWidth, t.parentElement.clientWidth]")
        expect(page.locator("#rules-group .errorlist").first).to_be_in_viewport()
        expect(page.locator("#cel-help")).to_contain_text("has(args.field)")
        screenshot(page, "rules")


def test_the_connection_form_shows_only_the_chosen_kinds_fields(new_context):
    build_setting()
    with daphne(SERVER_ENV) as base:
        page = new_context(base).new_page()
        log_in(page, "ada", "/admin/connections/connection/add/")
        page.goto("/admin/connections/connection/add/")
        page.select_option("#id_kind", "basic")
        expect(page.locator("#id_username")).to_be_visible()
        expect(page.locator("#id_password")).to_be_visible()
        expect(page.locator("#id_token")).to_be_hidden()
        page.select_option("#id_kind", "bearer")
        expect(page.locator("#id_token")).to_be_visible()
        expect(page.locator("#id_username")).to_be_hidden()
        screenshot(page, "connection")
