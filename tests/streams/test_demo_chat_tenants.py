"""/demo/chat/ for a staff member of several tenants: they choose one, then calls and the
stream name it (X-Toolhub-Tenant, ?tenant=)."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth.models import User
from django.test import Client
from guardian.shortcuts import assign_perm

from apps.tenants.models import Tenant
from apps.tools.models import Tool
from tests.conftest import allow, make_agent
from tests.streams.conftest import logged_in, open_ws, operator, refusal

URL = "/demo/chat/"

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def two_tenants(test_tools):
    acme, globex = make_agent("acme").tenant, make_agent("globex", "agent:other").tenant
    return acme, globex


@pytest.fixture
def olga(two_tenants) -> User:
    acme, globex = two_tenants
    user = operator("olga", acme)
    globex.members.add(user)
    return user


def page(user: User, **params: str) -> str:
    client = Client()
    client.force_login(user)
    response = client.get(URL, params)
    assert response.status_code == 200
    return response.content.decode()


def test_it_asks_a_staff_member_of_several_tenants_to_choose_one(olga):
    html = page(olga, run="run-7")
    assert 'id="tenant-choice"' in html
    assert 'href="?run=run-7&amp;tenant=acme"' in html
    assert 'href="?run=run-7&amp;tenant=globex"' in html
    assert 'id="call-form"' not in html


def test_after_choosing_the_page_names_the_tenant_for_calls_and_the_stream(olga):
    html = page(olga, run="run-7", tenant="globex")
    assert 'data-tenant="globex"' in html
    assert 'data-run-id="run-7"' in html
    assert 'id="call-form"' in html
    assert "<code>globex</code>" in html


def test_a_tenant_they_are_not_a_member_of_is_refused_with_the_choice_again(olga):
    Tenant.objects.create(slug="initech")
    html = page(olga, tenant="initech")
    assert 'id="tenant-problem"' in html and "initech" in html
    assert 'href="?tenant=acme"' in html
    assert 'id="call-form"' not in html


def test_a_staff_member_of_one_tenant_goes_straight_to_the_run(two_tenants):
    html = page(operator("solo", two_tenants[0]))
    assert 'data-tenant="acme"' in html


def test_a_staff_member_of_no_tenant_is_told_so():
    user = User.objects.create_user("nobody", password="pw-nobody-123", is_staff=True)
    html = page(user)
    assert "not a member of any tenant" in html
    assert 'id="call-form"' not in html


@pytest.mark.server
def test_a_multi_tenant_staff_member_streams_and_calls_in_the_chosen_tenant(server, olga):
    globex = olga.tenants.get(slug="globex")
    allow(globex, "test__echo")
    assign_perm("tools.execute_tool", olga, Tool.objects.get(pk="test__echo"))
    browser = logged_in(server, olga)
    # What the page did before: no tenant on the stream, none on the call.
    assert refusal(server, "/ws/v1/runs/run-c/", browser.ws_headers) == 4403
    status, _ = browser.post("/api/v1/invocations/", {"toolId": "test__echo", "runId": "run-c"})
    assert status == 403
    # What it does now.
    with open_ws(server, "/ws/v1/runs/run-c/?after=0&tenant=globex", browser.ws_headers) as ws:
        status, body = browser.post(
            "/api/v1/invocations/",
            {"toolId": "test__echo", "args": {"text": "hi"}, "runId": "run-c"},
            tenant="globex",
        )
        assert status == 200, body
        seen = json.loads(ws.recv(timeout=15))
        assert (seen["type"], seen["runId"]) == ("tool_call_start", "run-c")
