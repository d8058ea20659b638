"""The holes issue 9 names, each shown closed; and what superusers still may do."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client

from apps.connections.models import Connection
from apps.invocations.models import InvocationRecord, RunEvent
from apps.tenants.models import ApiKey, Tenant
from tests.admin.support import World

pytestmark = pytest.mark.django_db


def test_staff_cannot_create_an_api_key_for_another_tenant(world: World, staff_client: Client):
    globex = Tenant.objects.get(slug="globex")
    response = staff_client.post(
        "/admin/tenants/apikey/add/",
        {"tenant": globex.pk, "principal": "agent:intruder", "name": "", "_save": "Save"},
    )
    assert response.status_code == 200
    assert "Select a valid choice" in response.content.decode()
    assert not ApiKey.objects.filter(principal="agent:intruder").exists()


def test_staff_can_create_an_api_key_for_their_tenant(world: World, staff_client: Client):
    acme = Tenant.objects.get(slug="acme")
    response = staff_client.post(
        "/admin/tenants/apikey/add/",
        {"tenant": acme.pk, "principal": "agent:helper", "name": "", "_save": "Save"},
    )
    assert response.status_code == 200
    key = ApiKey.objects.get(principal="agent:helper")
    assert key.tenant == acme
    assert key.user.username == "agent+helper@acme"


def test_staff_cannot_add_a_host_to_another_tenants_connection(world: World, staff_client: Client):
    theirs = Connection.objects.get(name="globex-crm")
    response = staff_client.post(
        f"/admin/connections/connection/{theirs.pk}/change/",
        {
            "tenant": theirs.tenant_id,
            "name": theirs.name,
            "kind": theirs.kind,
            "allowed_hosts": '["api.globex.example", "evil.example"]',
            "_save": "Save",
        },
    )
    assert response.status_code in (302, 403, 404)
    theirs.refresh_from_db()
    assert theirs.allowed_hosts == ["api.globex.example"]


def test_staff_cannot_move_their_connection_to_another_tenant_or_create_one_there(
    world: World, staff_client: Client
):
    globex = Tenant.objects.get(slug="globex")
    response = staff_client.post(
        "/admin/connections/connection/add/",
        {
            "tenant": globex.pk,
            "name": "planted",
            "kind": "bearer",
            "token": "t0ken",
            "allowed_hosts": '["evil.example"]',
            "_save": "Save",
        },
    )
    assert response.status_code == 200
    assert not Connection.objects.filter(name="planted").exists()


def test_a_superuser_sees_every_tenants_rows(world: World, root_client: Client):
    for path in (
        "/admin/tenants/apikey/",
        "/admin/connections/connection/",
        "/admin/policies/policy/",
        "/admin/auth/user/",
        "/admin/auth/group/",
        "/admin/invocations/invocationrecord/",
    ):
        page = root_client.get(path).content.decode()
        assert "globex" in page and "acme" in page, path
    form = root_client.get("/admin/tenants/apikey/add/").content.decode()
    assert "globex" in form and "acme" in form


def test_records_and_events_cannot_be_deleted_even_by_a_superuser(
    world: World, root_client: Client
):
    record = InvocationRecord.objects.filter(tenant__slug="acme").get()
    event = RunEvent.objects.filter(tenant__slug="acme").get()
    for model, obj in (("invocationrecord", record), ("runevent", event)):
        assert root_client.get(f"/admin/invocations/{model}/{obj.pk}/delete/").status_code == 403
        root_client.post(
            f"/admin/invocations/{model}/",
            {"action": "delete_selected", "_selected_action": [obj.pk], "post": "yes"},
        )
    assert InvocationRecord.objects.filter(pk=record.pk).exists()
    assert RunEvent.objects.filter(pk=event.pk).exists()
    # Nor through a cascade: a tenant with records cannot be deleted from the admin.
    acme = Tenant.objects.get(slug="acme")
    root_client.post(f"/admin/tenants/tenant/{acme.pk}/delete/", {"post": "yes"})
    assert Tenant.objects.filter(pk=acme.pk).exists()


def test_a_new_api_keys_plaintext_is_on_the_page_once_and_never_in_a_cookie(
    world: World, root_client: Client
):
    acme = Tenant.objects.get(slug="acme")
    response = root_client.post(
        "/admin/tenants/apikey/add/",
        {"tenant": acme.pk, "principal": "agent:once", "name": "", "_save": "Save"},
    )
    page = response.content.decode()
    key = ApiKey.objects.get(principal="agent:once")
    start = page.index(f"th_{key.prefix}_")
    raw = page[start : page.index("<", start)]
    assert ApiKey.objects.for_raw_key(raw) == key
    assert "no-store" in response["Cache-Control"]
    assert raw not in str(response.cookies)
    assert not any(raw in str(m) for m in response.wsgi_request._messages)  # type: ignore[attr-defined]
    following = root_client.get("/admin/tenants/apikey/")
    assert raw not in following.content.decode()
    assert raw not in str(root_client.cookies)


def test_staff_see_tenant_users_and_groups_read_only(world: World, staff_client: Client):
    member = User.objects.get(username="acme-member")
    assert staff_client.get(f"/admin/auth/user/{member.pk}/change/").status_code == 200
    staff_client.post(
        f"/admin/auth/user/{member.pk}/change/",
        {"username": member.username, "is_superuser": "on", "is_staff": "on", "_save": "1"},
    )
    staff_client.post(
        f"/admin/auth/user/{world.staff.pk}/change/",
        {"username": world.staff.username, "is_superuser": "on", "is_staff": "on"},
    )
    member.refresh_from_db()
    world.staff.refresh_from_db()
    assert not member.is_superuser and not world.staff.is_superuser
    assert staff_client.get("/admin/auth/user/add/").status_code == 403
    assert staff_client.get(f"/admin/auth/user/{member.pk}/password/").status_code == 403


def test_staff_cannot_add_themselves_to_another_tenant(world: World, staff_client: Client):
    acme = Tenant.objects.get(slug="acme")
    globex = Tenant.objects.get(slug="globex")
    staff_client.post(
        f"/admin/tenants/tenant/{acme.pk}/change/",
        {"slug": "acme", "name": "Acme", "members": [world.staff.pk], "_save": "Save"},
    )
    staff_client.post(
        f"/admin/tenants/tenant/{globex.pk}/change/",
        {"slug": "globex", "members": [world.staff.pk], "_save": "Save"},
    )
    assert staff_client.get("/admin/tenants/tenant/add/").status_code == 403
    assert not globex.members.filter(pk=world.staff.pk).exists()
    acme.refresh_from_db()
    assert acme.slug == "acme" and acme.name == "Acme"


def test_staff_cannot_switch_a_global_tool_off(world: World, staff_client: Client):
    from apps.tools.models import Tool

    tool = Tool.objects.order_by("pk").first()
    assert tool is not None
    enabled = tool.enabled
    staff_client.post(
        f"/admin/tools/tool/{tool.pk}/change/",
        {"enabled": "" if enabled else "on", "_save": "Save"},
    )
    tool.refresh_from_db()
    assert tool.enabled == enabled
    assert 'name="form-0-enabled"' not in staff_client.get("/admin/tools/tool/").content.decode()


def test_task_results_are_for_superusers_only(
    world: World, staff_client: Client, root_client: Client
):
    from django_tasks_db.models import DBTaskResult

    path = "/admin/django_tasks_database/dbtaskresult/"
    result = DBTaskResult.objects.get()
    assert staff_client.get(path).status_code == 403
    assert staff_client.get(f"{path}{result.pk}/change/").status_code in (302, 403)
    assert f"{path}{result.pk}/change/" in root_client.get(path).content.decode()
