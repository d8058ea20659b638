"""Egress into private networks is the host operator's: a tenant admin cannot open it."""

from __future__ import annotations

from typing import Any

from django.test import Client
from django.urls import reverse

from apps.approvals.models import ApprovalWebhook
from apps.connections.models import Connection
from tests.admin.support import World, form_data


def change_url(connection: Connection) -> str:
    return reverse("admin:connections_connection_change", args=[connection.pk])


def own_connection(world: World) -> Connection:
    connection: Connection = world.own[Connection][0]
    return connection


def post_change(client: Client, page_url: str, model: Any, **changes: Any) -> Any:
    """The change form as the page shows it, with `changes` typed in, saved."""
    page = client.get(page_url)
    assert page.status_code == 200
    data = form_data(page.content.decode(), model)
    data.update({name: [value] for name, value in changes.items()})
    data["_save"] = ["Save"]
    return client.post(page_url, data)


def edit(client: Client, connection: Connection, **changes: Any) -> Any:
    return post_change(client, change_url(connection), Connection, **changes)


def test_a_tenant_admin_sees_allow_private_network_but_cannot_edit_it(
    world: World, staff_client: Client
) -> None:
    html = staff_client.get(change_url(own_connection(world))).content.decode()
    assert "Allow private network" in html
    assert 'name="allow_private_network"' not in html


def test_a_tenant_admins_forged_post_cannot_open_private_networks(
    world: World, staff_client: Client
) -> None:
    connection = own_connection(world)
    response = edit(staff_client, connection, allowed_hosts="127.0.0.1", allow_private_network="on")
    assert response.status_code == 302
    connection.refresh_from_db()
    assert connection.allowed_hosts == ["127.0.0.1"]
    assert connection.allow_private_network is False


def test_a_tenant_admin_cannot_add_a_connection_that_reaches_private_networks(
    world: World, staff_client: Client
) -> None:
    response = staff_client.post(
        reverse("admin:connections_connection_add"),
        {
            "tenant": str(world.own[Connection][0].tenant_id),
            "name": "loopback",
            "kind": "bearer",
            "allowed_hosts": "127.0.0.1",
            "allow_private_network": "on",
            "token": "a-token-long-enough-to-scrub",
            "_save": "Save",
        },
    )
    assert response.status_code == 302
    assert Connection.objects.get(name="loopback").allow_private_network is False


def test_a_superuser_can_let_a_connection_reach_private_networks(
    world: World, root_client: Client
) -> None:
    connection = own_connection(world)
    response = edit(root_client, connection, allowed_hosts="10.0.0.5", allow_private_network="on")
    assert response.status_code == 302
    connection.refresh_from_db()
    assert connection.allow_private_network is True


def test_a_tenant_admin_keeps_a_connection_a_superuser_opened_working(
    world: World, staff_client: Client
) -> None:
    connection = own_connection(world)
    Connection.objects.filter(pk=connection.pk).update(
        allow_private_network=True, allowed_hosts=["10.0.0.5"]
    )
    response = edit(staff_client, connection, name="renamed")
    assert response.status_code == 302
    connection.refresh_from_db()
    assert (connection.name, connection.allow_private_network) == ("renamed", True)


def test_a_tenant_admin_cannot_repoint_a_connection_a_superuser_opened(
    world: World, staff_client: Client
) -> None:
    connection = own_connection(world)
    Connection.objects.filter(pk=connection.pk).update(
        allow_private_network=True, allowed_hosts=["10.0.0.5"]
    )
    response = edit(staff_client, connection, allowed_hosts="127.0.0.1")
    assert response.status_code == 200
    assert "only a superuser may change them" in response.content.decode()
    connection.refresh_from_db()
    assert connection.allowed_hosts == ["10.0.0.5"]


def webhook_url(hook: ApprovalWebhook) -> str:
    return reverse("admin:approvals_approvalwebhook_change", args=[hook.pk])


def edit_webhook(client: Client, hook: ApprovalWebhook, **changes: Any) -> Any:
    return post_change(client, webhook_url(hook), ApprovalWebhook, **changes)


def own_webhook(world: World) -> ApprovalWebhook:
    hook: ApprovalWebhook = world.own[ApprovalWebhook][0]
    return hook


def test_a_tenant_admin_cannot_let_a_webhook_reach_private_networks(
    world: World, staff_client: Client
) -> None:
    hook = own_webhook(world)
    html = staff_client.get(webhook_url(hook)).content.decode()
    assert 'name="private_network"' not in html
    response = edit_webhook(
        staff_client, hook, url="http://127.0.0.1:8000/admin/", private_network="on"
    )
    assert response.status_code == 302
    hook.refresh_from_db()
    assert hook.private_network is False


def test_a_tenant_admin_cannot_repoint_a_webhook_a_superuser_opened(
    world: World, staff_client: Client, root_client: Client
) -> None:
    hook = own_webhook(world)
    response = edit_webhook(root_client, hook, url="http://10.0.0.5/hook", private_network="on")
    assert response.status_code == 302
    response = edit_webhook(staff_client, hook, url="http://127.0.0.1:8000/x")
    assert response.status_code == 200
    assert "only a superuser may change it" in response.content.decode()
    hook.refresh_from_db()
    assert hook.url == "http://10.0.0.5/hook"
    assert edit_webhook(staff_client, hook, name="renamed").status_code == 302
    hook.refresh_from_db()
    assert (hook.name, hook.private_network) == ("renamed", True)
