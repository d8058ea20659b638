"""The operators' stream re-reads what its feed may have missed: when the layer
dropped pushes, the group's feeds get a catch-up (events.Outbox) and each approvals
stream sends the approval events of its tenants it has not sent yet, from the database."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from guardian.shortcuts import remove_perm

from apps.approvals import decisions
from apps.approvals.models import ApprovalRequest
from apps.invocations import events
from apps.invocations.events import tenant_group
from apps.invocations.fanout import CATCH_UP_TYPE
from apps.tenants.models import Tenant
from apps.tools.models import Tool
from tests.conftest import Agent
from tests.streams.test_session_revocation import open_with, staff

pytestmark = pytest.mark.django_db(transaction=True)

STREAM = "/ws/v1/approvals/"


def hold(agent: Agent, run_id: str) -> str:
    response = agent.invoke("test__confirm", args={}, runId=run_id, toolCallId=f"{run_id}-c")
    assert response.json()["status"] == "pending_approval", response.content
    return str(response.json()["approvalId"])


def decide(approval_id: str, username: str) -> None:
    from django.contrib.auth.models import User

    decisions.decide(approval_id, User.objects.get(username=username), "approve", "fine")


@contextmanager
def operators_pushes_lost(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[dict[str, Any]]]:
    """The layer drops what is pushed to the tenants' groups meanwhile (listed here)."""
    dropped: list[dict[str, Any]] = []
    with monkeypatch.context() as patch:
        patch.setattr(
            events, "_push_to_operators", lambda layer, tenant_id, message: dropped.append(message)
        )
        yield dropped


async def catch_up(tenant: Tenant) -> None:
    """What the outbox sends a group whose pushes it dropped, once the layer is back."""
    await get_channel_layer().group_send(tenant_group(tenant.pk), {"type": CATCH_UP_TYPE})


async def test_approval_events_whose_push_was_lost_reach_the_stream_at_the_catch_up(
    acme, monkeypatch
):
    _, session_key = await database_sync_to_async(staff)(acme, "ops")
    stream = await open_with(STREAM, session_key)
    live = await database_sync_to_async(hold)(acme, "run-live")
    assert (await stream.receive_json_from(timeout=3))["approvalId"] == live

    with operators_pushes_lost(monkeypatch) as dropped:
        lost = await database_sync_to_async(hold)(acme, "run-lost")
    assert [message["approvalId"] for message in dropped] == [lost]
    assert await stream.receive_nothing(timeout=0.3)

    await catch_up(acme.tenant)
    required = await stream.receive_json_from(timeout=3)
    assert required == dropped[0]  # exactly as it would have been streamed
    assert required["type"] == "approval_required" and required["runId"] == "run-lost"
    assert await stream.receive_nothing(timeout=0.3)  # the live one is not sent again

    with operators_pushes_lost(monkeypatch) as dropped:
        await database_sync_to_async(decide)(lost, "ops")
        await database_sync_to_async(decide)(live, "ops")
    assert [message["type"] for message in dropped] == ["approval_decided"] * 2
    await catch_up(acme.tenant)
    await catch_up(acme.tenant)  # a second catch-up sends nothing twice
    first = await stream.receive_json_from(timeout=3)
    second = await stream.receive_json_from(timeout=3)
    assert [first, second] == dropped  # in the order they were written
    assert first["decision"] == "approve" and first["decidedBy"] == "ops"
    assert await stream.receive_nothing(timeout=0.3)
    await stream.disconnect()


async def test_a_catch_up_sends_nothing_the_operator_may_not_decide_or_from_another_tenant(
    acme, globex, monkeypatch
):
    user, session_key = await database_sync_to_async(staff)(acme, "ops")
    tool = await database_sync_to_async(Tool.objects.get)(pk="test__confirm")
    await database_sync_to_async(remove_perm)("tools.decide_approval", user, tool)
    stream = await open_with(STREAM, session_key)

    with operators_pushes_lost(monkeypatch) as dropped:
        await database_sync_to_async(hold)(acme, "run-not-theirs")
        await database_sync_to_async(hold)(globex, "run-of-globex")
    assert len(dropped) == 2
    await catch_up(acme.tenant)
    await catch_up(globex.tenant)
    assert await stream.receive_nothing(timeout=0.5)
    await stream.disconnect()


def test_events_since_reads_only_approval_events_of_the_tenants_from_that_time(acme, globex):
    from django.utils import timezone

    before = timezone.now()
    first = hold(acme, "run-1")
    hold(globex, "run-2")
    acme.invoke("test__echo", args={"text": "not held"}, runId="run-1")
    middle = timezone.now()
    second = hold(acme, "run-3")

    found = ApprovalRequest.objects.events_since([acme.tenant.pk], before)
    assert [(event["approvalId"], event["type"]) for event in found] == [
        (first, "approval_required"),
        (second, "approval_required"),
    ]
    later = ApprovalRequest.objects.events_since([acme.tenant.pk], middle)
    assert [event["approvalId"] for event in later] == [second]
    assert ApprovalRequest.objects.events_since([acme.tenant.pk], timezone.now()) == []
    assert len(ApprovalRequest.objects.events_since([acme.tenant.pk], before, limit=1)) == 1
