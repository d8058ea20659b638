"""A stream opened with a staff session ends (4403) once the session ends or its user
loses access (apps.invocations.revocations.SessionWatch), like a revoked key's streams."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.contrib.auth.models import User
from django.contrib.sessions.models import Session
from django.test import Client
from django.utils import timezone
from guardian.shortcuts import assign_perm, remove_perm

from apps.approvals import tasks
from apps.invocations import revocations
from apps.invocations.events import emit, tenant_group
from apps.invocations.models import StreamTicket
from apps.invocations.revocations import session_watch
from apps.tenants.models import ApiKey, Tenant
from apps.tools.models import Tool
from tests.support.feeds import listening
from toolhub.asgi import application

pytestmark = pytest.mark.django_db(transaction=True)

STREAMS = ["/ws/v1/runs/staff-run/", "/ws/v1/approvals/"]


@pytest.fixture(autouse=True)
def quick_recheck(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(revocations, "RECHECK_S", 0.05)


def staff(acme: Any, name: str) -> tuple[User, str]:
    user = User.objects.create_user(name, password="pw-for-tests-only", is_staff=True)
    acme.tenant.members.add(user)
    assign_perm("tools.decide_approval", user, Tool.objects.get(pk="test__confirm"))
    client = Client()
    client.force_login(user)
    return user, client.cookies[settings.SESSION_COOKIE_NAME].value


async def open_with(path: str, session_key: str) -> WebsocketCommunicator:
    stream = WebsocketCommunicator(
        application,
        path,
        headers=[(b"cookie", f"{settings.SESSION_COOKIE_NAME}={session_key}".encode())],
    )
    connected, _ = await stream.connect()
    assert connected
    return stream


async def closed_with(stream: WebsocketCommunicator) -> int | None:
    """The close code, skipping any event frames sent before it."""
    while True:
        output = await stream.receive_output(timeout=3)
        if output["type"] == "websocket.close":
            return output.get("code")


async def still_open(stream: WebsocketCommunicator) -> bool:
    """Nothing sent for a while, several re-checks long (the stream is not cancelled)."""
    return await stream.receive_nothing(timeout=0.3)


def deactivate(user: User, acme: Any) -> None:
    user.is_active = False
    user.save()


def unstaff(user: User, acme: Any) -> None:
    user.is_staff = False
    user.save()


def leave_tenant(user: User, acme: Any) -> None:
    acme.tenant.members.remove(user)


def log_out(user: User, acme: Any) -> None:
    for session in Session.objects.all():
        if session.get_decoded().get("_auth_user_id") == str(user.pk):
            session.delete()


def change_password(user: User, acme: Any) -> None:
    user.set_password("another-pw-for-tests-only")
    user.save()


LOSSES: list[Callable[[User, Any], None]] = [
    deactivate,
    unstaff,
    leave_tenant,
    log_out,
    change_password,
]


@pytest.mark.parametrize("path", STREAMS)
@pytest.mark.parametrize("loss", LOSSES, ids=lambda loss: loss.__name__)
async def test_a_staff_stream_ends_with_4403_when_its_user_loses_access(
    acme, test_tools, path, loss
):
    user, session_key = await database_sync_to_async(staff)(acme, "ops")
    _, other_key = await database_sync_to_async(staff)(acme, "other-ops")
    stream = await open_with(path, session_key)
    other = await open_with(path, other_key)
    assert await still_open(stream)  # re-checked, still allowed

    await database_sync_to_async(loss)(user, acme)

    assert await closed_with(stream) == 4403
    assert await still_open(other)  # another user's stream stays
    await stream.disconnect()
    await other.disconnect()
    assert not session_watch().streams


async def superuser_approvals_stream() -> tuple[User, WebsocketCommunicator]:
    root = await database_sync_to_async(User.objects.create_superuser)(
        "root", password="pw-for-tests-only"
    )
    client = Client()
    await database_sync_to_async(client.force_login)(root)
    stream = await open_with(
        "/ws/v1/approvals/", client.cookies[settings.SESSION_COOKIE_NAME].value
    )
    return root, stream


async def test_a_superuser_made_plain_staff_loses_the_tenants_it_is_not_a_member_of(acme):
    root, stream = await superuser_approvals_stream()
    assert await still_open(stream)

    root.is_superuser = False
    await database_sync_to_async(root.save)()
    assert await closed_with(stream) == 4403  # staff still, but a member of no tenant
    await stream.disconnect()


async def test_an_operator_whose_decide_permission_is_revoked_stops_seeing_its_approvals(
    acme, test_tools
):
    user, session_key = await database_sync_to_async(staff)(acme, "ops")
    stream = await open_with("/ws/v1/approvals/", session_key)

    async def approval(call_id: str) -> None:
        await database_sync_to_async(emit)(
            acme.tenant,
            "staff-approvals",
            "approval_required",
            tool_call_id=call_id,
            tool_id="test__confirm",
            approvalId=f"ap-{call_id}",
        )

    await listening(tenant_group(acme.tenant.pk))  # the bare event has no request to re-read
    await approval("before")
    assert (await stream.receive_json_from(timeout=3))["toolCallId"] == "before"

    tool = await database_sync_to_async(Tool.objects.get)(pk="test__confirm")
    await database_sync_to_async(remove_perm)("tools.decide_approval", user, tool)
    await asyncio.sleep(0.1)  # past RECHECK_S (0.05 s here): the cached answer expires
    await approval("later")
    assert await stream.receive_nothing(timeout=0.5)
    await stream.disconnect()


def approval_in(tenant: Tenant, call_id: str) -> None:
    emit(
        tenant,
        "staff-approvals",
        "approval_required",
        tool_call_id=call_id,
        tool_id="test__confirm",
        approvalId=f"ap-{call_id}",
    )


async def test_a_superusers_approvals_stream_takes_in_a_tenant_created_after_it_opened(
    acme, test_tools
):
    _, stream = await superuser_approvals_stream()
    await listening(tenant_group(acme.tenant.pk))
    newcomer = await database_sync_to_async(Tenant.objects.create)(slug="newcomer")
    # Taken in at a re-check (RECHECK_S is 0.05 s here); the bare events below have no
    # request a re-read would find, so they are sent once the stream listens.
    await listening(tenant_group(newcomer.pk))
    await database_sync_to_async(approval_in)(newcomer, "in-the-new-tenant")
    assert (await stream.receive_json_from(timeout=3))["toolCallId"] == "in-the-new-tenant"
    await database_sync_to_async(approval_in)(acme.tenant, "in-acme")
    assert (await stream.receive_json_from(timeout=3))["toolCallId"] == "in-acme"
    await stream.disconnect()


async def test_an_operators_approvals_stream_takes_in_a_tenant_they_join_while_it_is_open(
    acme, globex, test_tools
):
    user, session_key = await database_sync_to_async(staff)(acme, "ops")
    stream = await open_with("/ws/v1/approvals/", session_key)
    await database_sync_to_async(approval_in)(globex.tenant, "before-joining")
    assert await stream.receive_nothing(timeout=0.3)  # not theirs (yet)

    await database_sync_to_async(globex.tenant.members.add)(user)
    await listening(tenant_group(globex.tenant.pk))  # taken in at a re-check
    await database_sync_to_async(approval_in)(globex.tenant, "after-joining")
    assert (await stream.receive_json_from(timeout=3))["toolCallId"] == "after-joining"
    assert await stream.receive_nothing(timeout=0.2)  # each event once

    await database_sync_to_async(globex.tenant.members.remove)(user)  # and leaving ends it
    assert await closed_with(stream) == 4403
    await stream.disconnect()
    assert not session_watch().streams


def staff_ticket(user: User, run_id: str) -> str:
    """A ticket the user's browser session asks for (POST /api/v1/stream-tickets/)."""
    client = Client()
    client.force_login(user)
    response = client.post(
        "/api/v1/stream-tickets/", {"runId": run_id}, content_type="application/json"
    )
    assert response.status_code == 201, response.content
    return str(response.json()["ticket"])


@pytest.mark.parametrize("loss", LOSSES, ids=lambda loss: loss.__name__)
async def test_a_stream_opened_with_a_staff_sessions_ticket_ends_when_the_session_loses_access(
    acme, test_tools, loss
):
    """A ticket carries no key for KeyWatch: the session it was issued under is watched."""
    user, _ = await database_sync_to_async(staff)(acme, "ops")
    other_user, _ = await database_sync_to_async(staff)(acme, "other-ops")
    ticket = await database_sync_to_async(staff_ticket)(user, "ticket-run")
    others = await database_sync_to_async(staff_ticket)(other_user, "ticket-run")
    stream = await open_without_cookie(f"/ws/v1/runs/ticket-run/?ticket={ticket}")
    other = await open_without_cookie(f"/ws/v1/runs/ticket-run/?ticket={others}")
    assert await still_open(stream)  # re-checked, still allowed

    await database_sync_to_async(loss)(user, acme)

    assert await closed_with(stream) == 4403
    assert await still_open(other)
    await stream.disconnect()
    await other.disconnect()
    assert not session_watch().streams


async def test_a_ticket_of_a_session_that_ended_before_the_handshake_opens_nothing(
    acme, test_tools, monkeypatch
):
    monkeypatch.setattr(revocations, "RECHECK_S", 60.0)  # only the handshake can end it
    user, _ = await database_sync_to_async(staff)(acme, "ops")
    ticket = await database_sync_to_async(staff_ticket)(user, "ticket-run")
    await database_sync_to_async(log_out)(user, acme)
    stream = await open_without_cookie(f"/ws/v1/runs/ticket-run/?ticket={ticket}")
    assert await closed_with(stream) == 4403
    await stream.disconnect()
    assert not session_watch().streams


async def test_a_ticket_of_a_user_deactivated_before_the_handshake_ends_at_the_first_check(
    acme, test_tools
):
    """What the handshake cannot see (a deactivated user) the first re-check ends."""
    user, _ = await database_sync_to_async(staff)(acme, "ops")
    ticket = await database_sync_to_async(staff_ticket)(user, "ticket-run")
    await database_sync_to_async(deactivate)(user, acme)
    stream = WebsocketCommunicator(application, f"/ws/v1/runs/ticket-run/?ticket={ticket}")
    connected, _ = await stream.connect()
    assert connected
    assert await closed_with(stream) == 4403
    await stream.disconnect()


async def open_without_cookie(path: str) -> WebsocketCommunicator:
    stream = WebsocketCommunicator(application, path)
    connected, _ = await stream.connect()
    assert connected
    return stream


def ticket_row(raw: str) -> StreamTicket:
    return StreamTicket.objects.get(token_hash=hashlib.sha256(raw.encode()).hexdigest())


async def test_a_spent_ticket_keeps_no_copy_of_its_sessions_key_yet_its_stream_is_watched(
    acme, test_tools
):
    """The row holds the session key only until the ticket is spent; the stream keeps
    it in memory and still ends when the session does."""
    user, _ = await database_sync_to_async(staff)(acme, "ops")
    ticket = await database_sync_to_async(staff_ticket)(user, "ticket-run")
    issued = await database_sync_to_async(ticket_row)(ticket)
    assert issued.session_key and issued.used_at is None

    stream = await open_without_cookie(f"/ws/v1/runs/ticket-run/?ticket={ticket}")
    spent = await database_sync_to_async(ticket_row)(ticket)
    assert spent.used_at is not None and spent.session_key == ""
    assert await still_open(stream)

    await database_sync_to_async(log_out)(user, acme)
    assert await closed_with(stream) == 4403
    await stream.disconnect()
    again = await open_without_cookie(f"/ws/v1/runs/ticket-run/?ticket={ticket}")
    assert await closed_with(again) == 4403  # still single use
    await again.disconnect()


def test_the_sweeper_erases_the_session_key_of_expired_tickets_only(acme, test_tools):
    user, _ = staff(acme, "ops")
    expired, fresh = staff_ticket(user, "run-a"), staff_ticket(user, "run-b")
    StreamTicket.objects.filter(pk=ticket_row(expired).pk).update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )
    key, _ = ApiKey.objects.issue(acme.tenant, "agent:other")
    keyed = StreamTicket.objects.create(  # an API key's ticket has no session to erase
        tenant=acme.tenant,
        principal="agent:other",
        user=user,
        api_key=key,
        run_id="run-c",
        token_hash="c" * 64,
        expires_at=timezone.now() - timedelta(seconds=1),
    )

    tasks.sweep()

    assert ticket_row(expired).session_key == ""
    assert ticket_row(fresh).session_key != ""  # still redeemable: keeps what it is checked by
    keyed.refresh_from_db()
    assert keyed.api_key_id == key.pk and keyed.used_at is None
    assert StreamTicket.objects.forget_sessions() == 0  # nothing left to erase
