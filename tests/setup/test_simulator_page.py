"""The dry-run form in the admin: verdicts per check, nothing recorded, tenant-scoped."""

from __future__ import annotations

from typing import Any

from apps.invocations.models import InvocationRecord, RunEvent
from apps.policies.setup import grant_tool
from apps.tools.models import Tool
from tests.setup.conftest import SIMULATE_URL, Setting, logged_in
from tests.support.deep_json import TOO_DEEP, deep_texts, logged_tracebacks

TIME = "core__get_current_time"


def dry_run(client: Any, setting: Setting, **fields: Any) -> str:
    data = {
        "tenant": setting.agent.tenant.pk,
        "principal": setting.agent.principal,
        "tool_id": TIME,
        "args": '{"timezone": "UTC"}',
        **fields,
    }
    response = client.post(SIMULATE_URL, data)
    assert response.status_code == 200
    return response.content.decode()


def test_it_shows_the_decision_the_deciding_rule_and_each_check(setting, admin_client):
    grant_tool(setting.agent.tenant, setting.agent.principal, Tool.objects.get(pk=TIME))
    page = dry_run(admin_client, setting)
    assert "Decision: allow" in page
    assert "policy:" in page and "setup: agent:demo" in page
    for check in ("lookup_tool", "check_policy", "check_permission", "validate_args"):
        assert f"<code>{check}</code>" in page
    assert InvocationRecord.objects.count() == 0 and RunEvent.objects.count() == 0


def test_it_shows_a_denial_by_default_and_argument_errors(setting, admin_client):
    page = dry_run(admin_client, setting, args='{"timezone": 3}')
    assert "Decision: deny" in page
    assert "default:deny" in page
    assert "Argument errors" in page and "<code>timezone</code>" in page


def test_an_unknown_tool_answers_unavailable(setting, admin_client):
    page = dry_run(admin_client, setting, tool_id="core__nope")
    assert "unavailable" in page and "not reached" in page


def test_an_unknown_principal_is_a_form_error(setting, admin_client):
    page = dry_run(admin_client, setting, principal="agent:typo")
    assert "has no principal" in page
    assert "Decision:" not in page


def test_arguments_that_are_not_json_are_a_form_error(setting, admin_client):
    page = dry_run(admin_client, setting, args="{oops")
    assert "Not JSON" in page


@deep_texts
def test_arguments_nested_too_deeply_are_a_form_error(setting, admin_client, text, caplog):
    page = dry_run(admin_client, setting, args=text)
    assert f"{TOO_DEEP} The dry run would answer invalid_json." in page
    assert "Decision:" not in page
    assert logged_tracebacks(caplog) == []


def test_another_tenant_cannot_be_asked_about(setting, admin_client):
    page = dry_run(
        admin_client,
        setting,
        tenant=setting.stranger.tenant.pk,
        principal=setting.stranger.principal,
    )
    assert "Select a valid choice" in page
    assert "Decision:" not in page


def test_an_operator_without_policy_view_cannot_open_it(setting):
    assert logged_in(setting.operator).get(SIMULATE_URL).status_code == 403
