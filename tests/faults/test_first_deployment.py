"""A first real deployment without the demo command: the documented commands give a
new tenant's agent a usable tool and an operator who can decide its held calls."""

from __future__ import annotations

import io

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from rest_framework.test import APIClient

from apps.approvals import decisions
from apps.approvals.models import ApprovalRequest

pytestmark = pytest.mark.django_db


def command(*args: str) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def test_the_documented_commands_give_an_agent_a_tool_and_an_operator_a_decision():
    command("create_tenant", "northwind", "--name", "Northwind")
    key = command("create_api_key", "--tenant", "northwind", "--principal", "agent:bot")
    key = key.strip().splitlines()[-1]
    allowed = command(
        "allow_tool", "--tenant", "northwind", "--principal", "agent:bot",
        "--tool", "core__get_current_time",
    )  # fmt: skip
    assert "created" in allowed
    command(
        "allow_tool", "--tenant", "northwind", "--principal", "agent:bot",
        "--tool", "core__planning_read_plan", "--approval",
    )  # fmt: skip
    assert "exists" in command(
        "allow_tool", "--tenant", "northwind", "--principal", "agent:bot",
        "--tool", "core__get_current_time",
    )  # fmt: skip
    command("create_staff", "--tenant", "northwind", "--username", "nora", "--password", "x" * 16)

    agent = APIClient()
    agent.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    ran = agent.post(
        "/api/v1/invocations/",
        {"toolId": "core__get_current_time", "args": {}, "runId": "run-first"},
        format="json",
    )
    assert ran.status_code == 200 and ran.json()["ok"] is True, ran.json()
    held = agent.post(
        "/api/v1/invocations/",
        {"toolId": "core__planning_read_plan", "args": {}, "runId": "run-first"},
        format="json",
    )
    assert held.json()["status"] == "pending_approval", held.json()
    approval = ApprovalRequest.objects.get(pk=held.json()["approvalId"])
    decisions.decide(approval.pk, User.objects.get(username="nora"), "approve")
    approval.refresh_from_db()
    assert approval.status == "approved"
