"""The tool admin's "forget remembered keys" action (apps/invocations/ledger.py): a
superuser forgets a tool's keys in every tenant, a tenant admin in their own only."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client

from apps.invocations.models import IdempotencyEntry
from apps.tenants.models import Role
from apps.tenants.roles import grant_role
from tests.conftest import Agent, allow, make_agent

pytestmark = pytest.mark.django_db(transaction=True)

CHANGELIST = "/admin/tools/tool/"
CLOCK = "core__get_current_time"
ACTION = "forget_remembered_keys"


@pytest.fixture
def callers(agent: Agent) -> tuple[Agent, Agent]:
    """acme's and globex's agents, each with a remembered key for the clock."""
    other = make_agent("globex", "agent:globex")
    allow(other.tenant, CLOCK)
    for each, key in ((agent, "k-acme"), (other, "k-globex")):
        assert each.invoke(CLOCK, idempotencyKey=key).json()["ok"] is True
    return agent, other


def browser(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def forget(client: Client, *tool_ids: str) -> object:
    return client.post(
        CHANGELIST, {"action": ACTION, "_selected_action": list(tool_ids)}, follow=True
    )


def replayed(agent: Agent, key: str) -> bool:
    """Whether a retry with `key` answers with the remembered call instead of running."""
    retry = agent.invoke(CLOCK, idempotencyKey=key).json()
    first = IdempotencyEntry.objects.get(key=key).record_id
    return retry["invocationId"] == str(first) and retry["ok"] is True


def messages_of(response: object) -> list[str]:
    return [str(m) for m in response.context["messages"]]  # type: ignore[attr-defined]


def test_a_tenant_admin_forgets_the_tools_keys_in_their_tenant_only(callers):
    acme, globex = callers
    dana = User.objects.create_user("dana", password="pw-dana-12345")
    grant_role(dana, acme.tenant, Role.ADMIN)
    grant_role(dana, globex.tenant, Role.OPERATOR)  # not an admin there
    entry = IdempotencyEntry.objects.get(key="k-acme")

    response = forget(browser(dana), CLOCK)

    assert response.status_code == 200
    assert messages_of(response) == ["1 idempotency key(s) of 1 tool(s) forgotten in acme."]
    again = acme.invoke(CLOCK, idempotencyKey="k-acme").json()
    assert again["ok"] is True and again["invocationId"] != str(entry.record_id)
    assert replayed(globex, "k-globex")  # another tenant's key survives


def test_a_superuser_forgets_the_tools_keys_in_every_tenant(callers):
    acme, globex = callers
    root = User.objects.create_superuser("root", "root@example.com", "pw-root-123456")
    before = dict(IdempotencyEntry.objects.values_list("key", "record_id"))

    response = forget(browser(root), CLOCK, "core__send_email")

    assert messages_of(response) == ["2 idempotency key(s) of 2 tool(s) forgotten in every tenant."]
    for each, key in ((acme, "k-acme"), (globex, "k-globex")):
        again = each.invoke(CLOCK, idempotencyKey=key).json()
        assert again["ok"] is True and again["invocationId"] != str(before[key])


def test_the_action_forgets_only_the_selected_tools_keys(callers, test_tools):
    acme, _ = callers
    allow(acme.tenant, "test__echo")
    assert acme.invoke("test__echo", args={"text": "x"}, idempotencyKey="k-echo").json()["ok"]
    root = User.objects.create_superuser("root", "root@example.com", "pw-root-123456")

    forget(browser(root), "test__echo")

    assert replayed(acme, "k-acme")


def test_an_operator_is_not_offered_the_action_and_a_forged_post_is_refused(callers):
    acme, _ = callers
    olga = User.objects.create_user("olga", password="pw-olga-12345")
    grant_role(olga, acme.tenant, Role.OPERATOR)
    client = browser(olga)

    page = client.get(CHANGELIST)
    forged = client.post(CHANGELIST, {"action": ACTION, "_selected_action": [CLOCK]})

    assert page.status_code == 200 and ACTION not in page.content.decode()
    assert forged.status_code in (200, 302, 403)
    assert replayed(acme, "k-acme")
