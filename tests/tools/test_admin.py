"""Staff manage the catalog and keys in the Django admin; the API obeys at once."""

from __future__ import annotations

import hashlib
import re

import pytest
from django.contrib import admin
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from apps.planning.models import Plan
from apps.policies.models import Policy
from apps.tenants.models import ApiKey, Tenant
from apps.tools.admin import CALL_SETTINGS
from apps.tools.models import Tool

CHANGELIST = "/admin/tools/tool/"


@pytest.fixture
def superuser(db: None) -> User:
    return User.objects.create_superuser("root", "root@example.com", "pw-root-123456")


@pytest.fixture
def admin_browser(superuser: User) -> Client:
    client = Client()
    client.force_login(superuser)
    return client


def switch(client: Client, action: str, *tool_ids: str):
    """The changelist's action as a browser posts it: the rows ticked, the action chosen."""
    return client.post(
        CHANGELIST, {"action": action, ACTION_CHECKBOX_NAME: list(tool_ids), "index": "0"}
    )


def test_anonymous_visitors_are_sent_to_the_admin_login(db):
    response = Client().get(CHANGELIST)
    assert response.status_code == 302
    assert response["Location"].startswith("/admin/login/")


def test_the_tool_changelist_shows_enabled_and_offers_the_switches(admin_browser):
    """`enabled` is a column to read (no form a row: issue 45); a superuser switches tools
    with the list's actions, or on a tool's page."""
    response = admin_browser.get(CHANGELIST)
    assert response.status_code == 200
    html = response.content.decode()
    assert "core__get_current_time" in html
    assert not re.findall(r'name="form-\d+-enabled"', html)
    assert len(re.findall(r'<td class="field-enabled"><img ', html)) == Tool.objects.count()
    assert '<option value="enable_tools">' in html
    assert '<option value="disable_tools">' in html


def test_tools_cannot_be_added_through_the_admin(admin_browser):
    assert admin_browser.get("/admin/tools/tool/add/").status_code == 403


@pytest.mark.django_db(transaction=True)
def test_disabling_a_tool_in_the_admin_stops_calls_and_hides_it(agent, superuser):
    before = agent.invoke("core__get_current_time")
    assert before.status_code == 200
    assert before.json()["ok"] is True, before.json()

    browser = Client()
    browser.force_login(superuser)
    response = switch(browser, "disable_tools", "core__get_current_time")
    assert response.status_code == 302, response.content.decode()[:2000]

    assert Tool.objects.get(pk="core__get_current_time").enabled is False
    assert Tool.objects.get(pk="core__planning_read_plan").enabled is True

    after = agent.invoke("core__get_current_time")
    assert after.status_code == 200
    body = after.json()
    assert body["ok"] is False
    assert body["errorCode"] == "unavailable"
    assert "result" not in body or body["result"] is None

    ids = [tool["id"] for tool in agent.tools().json()["tools"]]
    assert "core__get_current_time" not in ids
    assert "core__planning_read_plan" in ids


def test_re_enabling_a_tool_in_the_admin_lists_it_again(admin_browser, agent):
    Tool.objects.filter(pk="core__get_current_time").update(enabled=False)
    assert switch(admin_browser, "enable_tools", "core__get_current_time").status_code == 302
    assert Tool.objects.get(pk="core__get_current_time").enabled is True
    assert "core__get_current_time" in [t["id"] for t in agent.tools().json()["tools"]]


def test_the_tool_change_page_shows_the_contract_read_only(admin_browser):
    response = admin_browser.get(
        reverse("admin:tools_tool_change", args=["core__get_current_time"])
    )
    assert response.status_code == 200
    form = response.context["adminform"].form
    # The contract is read-only; a superuser switches the tool and sets its call settings.
    assert set(form.fields) == {
        "enabled",
        "cache_ttl_s",
        "cache_scope",
        "max_concurrency",
        *CALL_SETTINGS,
        "call_settings_by_staff",
    }


@pytest.mark.parametrize(
    "url",
    [
        "/admin/",
        "/admin/tools/tool/",
        "/admin/policies/policy/",
        "/admin/policies/policy/add/",
        "/admin/tenants/tenant/",
        "/admin/tenants/tenant/add/",
        "/admin/tenants/apikey/",
        "/admin/tenants/apikey/add/",
        "/admin/planning/plan/",
        "/admin/connections/connection/",
    ],
)
def test_admin_pages_render(admin_browser, agent, url):
    response = admin_browser.get(url)
    assert response.status_code == 200


def test_every_registered_model_has_a_working_changelist(admin_browser, agent):
    for model in admin.site._registry:
        meta = model._meta
        url = reverse(f"admin:{meta.app_label}_{meta.model_name}_changelist")
        assert admin_browser.get(url).status_code == 200, url


def test_change_pages_of_existing_rows_render(admin_browser, agent):
    plan = Plan.objects.create(tenant=agent.tenant, run_id="run-1", objective="Ship it")
    key = ApiKey.objects.get(tenant=agent.tenant)
    urls = [
        reverse("admin:policies_policy_change", args=[Policy.objects.get(tenant=agent.tenant).pk]),
        reverse("admin:tenants_tenant_change", args=[agent.tenant.pk]),
        reverse("admin:tenants_apikey_change", args=[key.pk]),
        reverse("admin:planning_plan_change", args=[plan.pk]),
    ]
    for url in urls:
        assert admin_browser.get(url).status_code == 200, url


def test_a_key_created_in_the_admin_is_shown_once_and_stored_as_a_hash(admin_browser, db):
    tenant = Tenant.objects.create(slug="umbrella", name="Umbrella")
    response = admin_browser.post(
        "/admin/tenants/apikey/add/",
        {
            "tenant": tenant.pk,
            "principal": "agent:admin-made",
            "name": "made in the admin",
            "revoked_at_0": "",
            "revoked_at_1": "",
        },
        follow=True,
    )
    # Shown on the answering page itself (no redirect, no message in the cookie).
    assert response.status_code == 200
    assert not response.redirect_chain
    page = response.content.decode()
    assert not [m for m in response.context["messages"] if "th_" in str(m)]
    found = re.search(r"\bth_[0-9a-f]{8}_[A-Za-z0-9_-]{20,}", page)
    assert found is not None, page[:3000]
    raw = found.group(0)
    secret = raw[len("th_") + 9 :]  # the part after the public prefix
    assert page.count(secret) == 1

    key = ApiKey.objects.get(principal="agent:admin-made")
    assert key.tenant == tenant
    assert raw.startswith(f"th_{key.prefix}_")
    assert key.key_hash == hashlib.sha256(raw.encode()).hexdigest()
    stored = " ".join(
        str(value) for value in ApiKey.objects.filter(pk=key.pk).values().get().values()
    )
    assert secret not in stored

    # The key works, and the admin never shows it again.
    api = Client(HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert api.get("/api/v1/tools/").status_code == 200
    for url in ("/admin/tenants/apikey/", reverse("admin:tenants_apikey_change", args=[key.pk])):
        page = admin_browser.get(url)
        assert page.status_code == 200
        assert secret not in page.content.decode()


def test_a_key_with_a_malformed_principal_is_refused_by_the_admin_form(admin_browser, db):
    tenant = Tenant.objects.create(slug="umbrella")
    response = admin_browser.post(
        "/admin/tenants/apikey/add/",
        {
            "tenant": tenant.pk,
            "principal": "Not A Principal",
            "revoked_at_0": "",
            "revoked_at_1": "",
        },
    )
    assert response.status_code == 200
    assert response.context["adminform"].form.errors["principal"]
    assert not ApiKey.objects.exists()
