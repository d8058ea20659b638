"""Issue 46, the admin as a newcomer meets it: the index links to the pages to start
with, task results stay out of staff's sight, hosts read as hosts, and the API-key add
form asks only for what a new key needs."""

from __future__ import annotations

import re

from django.test import Client

from apps.connections.models import Connection
from apps.tenants.models import ApiKey
from tests.admin.support import World


def test_the_index_links_to_setup_dry_run_the_overview_and_the_console(
    world: World, staff_client: Client
):
    page = staff_client.get("/admin/").content.decode()
    shortcuts = page[page.index('id="toolhub-shortcuts"') :]
    for href in (
        "/admin/policies/policy/setup/",
        "/admin/policies/policy/simulate/",
        "/console/overview/",
        '"/console/"',
    ):
        assert href.strip('"') in shortcuts, href
    # The model list is still there below.
    assert "/admin/policies/policy/" in page and "/admin/connections/connection/" in page


def test_staff_do_not_see_the_task_queue_app_superusers_do(
    world: World, staff_client: Client, root_client: Client
):
    assert "Tasks Database Backend" not in staff_client.get("/admin/").content.decode()
    assert "/admin/django_tasks_database/" not in staff_client.get("/admin/").content.decode()
    assert "/admin/django_tasks_database/" in root_client.get("/admin/").content.decode()


def test_the_connection_list_shows_hosts_not_a_json_list(world: World, staff_client: Client):
    connection = Connection.objects.get(name="acme-crm")
    connection.allowed_hosts = ["api.acme.example", "*.acme.example"]
    connection.save()
    page = staff_client.get("/admin/connections/connection/").content.decode()
    assert "api.acme.example, *.acme.example" in page
    assert "[&quot;api.acme.example" not in page and '["api.acme.example' not in page


def test_the_api_key_add_form_has_no_revocation_prefix_or_dates(world: World, staff_client: Client):
    page = staff_client.get("/admin/tenants/apikey/add/").content.decode()
    assert 'name="principal"' in page and 'name="tenant"' in page
    for hidden in ("revoked_at", "display_prefix", "created_at", "last_used_at"):
        assert not re.search(rf'(name|class)="[^"]*{hidden}', page), hidden
    assert "Revoked at" not in page and "Display prefix" not in page
    # A saved key still shows them.
    key = ApiKey.objects.get(tenant__slug="acme")
    change = staff_client.get(f"/admin/tenants/apikey/{key.pk}/change/").content.decode()
    assert "Revoked at" in change or "revoked at" in change.lower()
