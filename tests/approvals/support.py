"""Helpers shared by the approval tests: operators, holding calls, deciding, the queue."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.contrib.auth.models import User
from django_tasks_db.models import DBTaskResult
from guardian.shortcuts import assign_perm
from rest_framework.test import APIClient

from apps.approvals import tasks
from apps.approvals.models import ApprovalRequest
from apps.approvals.worker import build_worker
from apps.invocations.events import run_group
from apps.invocations.models import InvocationRecord, RunEvent
from apps.policies.models import Policy, PolicyRule
from apps.tenants.models import Tenant
from apps.tools.models import Tool
from tests.conftest import Agent

CONFIRM = "test__confirm"  # external_side_effect, requires_confirmation: always held
ECHO = "test__echo"  # read_only: held only where a policy says so
SLEEP = "test__sleep"
TALLY = "test__tally"  # external_side_effect, requires_confirmation; counts its executions
TEST_TOOLS = (CONFIRM, ECHO, SLEEP, TALLY)


def drain_queue(worker_id: str = "test-drain") -> None:
    """Run every queued task (approved calls, notifications) in this thread, until empty."""
    build_worker(worker_id, batch=True, interval=0).run()


def make_operator(
    username: str,
    *tenants: Tenant,
    tools: tuple[str, ...] = TEST_TOOLS,
    email: str | None = None,
    is_staff: bool = True,
) -> User:
    """A staff user operating `tenants`, with decide_approval on `tools`."""
    user = User.objects.create_user(
        username,
        email=email if email is not None else f"{username}@example.com",
        password=f"pw-{username}-12345",
        is_staff=is_staff,
    )
    for tenant in tenants:
        tenant.members.add(user)
    for tool in Tool.objects.filter(pk__in=tools):
        assign_perm("tools.decide_approval", user, tool)
    return user


def logged_in(user: User) -> APIClient:
    client = APIClient()
    client.force_login(user)
    return client


def require_approval(tenant: Tenant, *tool_ids: str, name: str = "held") -> Policy:
    """A policy listing the tools and naming their effects as needing approval."""
    tools = list(Tool.objects.filter(pk__in=tool_ids))
    policy = Policy.objects.create(
        tenant=tenant, name=name, approval_effects=sorted({tool.effect for tool in tools})
    )
    policy.tools.add(*tools)
    return policy


def add_rule(policy: Policy, condition: str, outcome: str, tool_pattern: str = "*") -> PolicyRule:
    rule = PolicyRule(
        policy=policy, condition=condition, outcome=outcome, tool_pattern=tool_pattern
    )
    rule.full_clean()
    rule.save()
    return rule


def hold(agent: Agent, tool_id: str, **body: Any) -> tuple[dict[str, Any], ApprovalRequest]:
    """Invoke a tool that needs a human: 202 and its pending approval."""
    response = agent.invoke(tool_id, **body)
    assert response.status_code == 202, response.content
    data = response.json()
    return data, ApprovalRequest.objects.get(pk=data["approvalId"])


def decision_url(approval_id: Any) -> str:
    return f"/api/v1/approvals/{approval_id}/decision/"


def post_decision(client: APIClient, approval_id: Any, decision: str = "approve", **body: Any):
    return client.post(decision_url(approval_id), {"decision": decision, **body}, format="json")


def cancel_url(invocation_id: Any) -> str:
    return f"/api/v1/invocations/{invocation_id}/cancel/"


def record_of(approval: ApprovalRequest) -> InvocationRecord:
    return InvocationRecord.objects.get(pk=approval.invocation_id)


def events(tenant: Tenant, run_id: str) -> list[dict[str, Any]]:
    return [
        event.message
        for event in RunEvent.objects.filter(tenant=tenant, run_id=run_id).order_by("seq")
    ]


def subscribed(tenant: Tenant, run_id: str) -> Callable[[], list[dict[str, Any]]]:
    """A channel in the run's group, on a flushed layer. Called, the answer reads what the
    channel was sent, until nothing more comes for 0.3 s."""
    layer = get_channel_layer()
    async_to_sync(layer.flush)()
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(run_group(tenant.pk, run_id), channel)

    async def received() -> list[dict[str, Any]]:
        messages = []
        with contextlib.suppress(TimeoutError):
            while True:
                messages.append(await asyncio.wait_for(layer.receive(channel), 0.3))
        return messages

    return async_to_sync(received)


def event_types(tenant: Tenant, run_id: str) -> list[str]:
    return [event["type"] for event in events(tenant, run_id)]


def queue_entries(approval: ApprovalRequest) -> list[DBTaskResult]:
    """The queue entries that would run this approved call."""
    return [
        entry
        for entry in DBTaskResult.objects.filter(task_path=tasks.run_approved_call.module_path)
        if entry.args_kwargs["args"] == [str(approval.pk)]
    ]


class Tally:
    """Reads the trace test__tally leaves: one line per execution."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.touch()

    def args(self, token: str) -> dict[str, str]:
        return {"path": str(self.path), "token": token}

    def count(self, token: str) -> int:
        return self.path.read_text(encoding="utf-8").splitlines().count(token)
