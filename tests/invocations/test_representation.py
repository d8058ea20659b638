"""A record's API representation is written by hand (InvocationRecord.as_api, issue 13):
it must say exactly what DRF's field machinery said from the serializer's declarations,
for every kind of record."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from rest_framework import serializers

from apps.approvals.models import ApprovalRequest
from apps.invocations.api.serializers import InvocationSerializer
from apps.invocations.models import ErrorCode, InvocationRecord, Status
from apps.tenants.models import ApiKey, Tenant
from apps.tools.models import Tool
from tests.conftest import Agent

TOOL = "core__get_current_time"


def by_drf(record: InvocationRecord) -> dict[str, Any]:
    """What the serializer gave before: DRF's fields, then the empty optionals dropped."""
    data = serializers.ModelSerializer.to_representation(InvocationSerializer(), record)
    for name in InvocationSerializer.OPTIONAL:
        if data.get(name) in (None, ""):
            data.pop(name, None)
    if record.ok is not True:
        data.pop("result", None)
    return dict(data)


def record(tenant: Tenant, **fields: Any) -> InvocationRecord:
    defaults: dict[str, Any] = {
        "tenant": tenant,
        "tool": Tool.objects.get(pk=TOOL),
        "tool_ref": TOOL,
        "tool_call_id": f"call_{uuid.uuid4().hex}",
        "run_id": "run-r",
        "principal": "agent:test",
        "status": Status.RUNNING,
    }
    return InvocationRecord.objects.create(**(defaults | fields))


@pytest.mark.django_db
@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"status": Status.SUCCEEDED, "ok": True, "result": {"now": "x", "n": [1, 2.5, None]}},
        {"status": Status.SUCCEEDED, "ok": True, "result": None},
        {"status": Status.SUCCEEDED, "ok": True, "result": {}},
        {
            "status": Status.FAILED,
            "ok": False,
            "result": {"never": "shown"},
            "error_code": ErrorCode.RATE_LIMITED,
            "safe_message": "Rate limit reached.",
            "retry_after_ms": 0,
        },
        {"status": Status.FAILED, "ok": False, "error_code": ErrorCode.VALIDATION},
        {
            "args": {"city": "Zürich", "deep": {"a": [1]}},
            "connection_id": str(uuid.uuid4()),
            "idempotency_key": "key-1",
            "policy_rule": "policy:allow",
        },
        {"args": None, "idempotency_key": ""},
    ],
)
def test_it_represents_every_kind_of_record_as_drf_did(agent: Agent, fields: Any) -> None:
    now = timezone.now()
    made = record(
        agent.tenant,
        started_at=now,
        ended_at=now + timedelta(microseconds=1500),
        duration_ms=1,
        **fields,
    )
    fresh = InvocationRecord.objects.get(pk=made.pk)  # as the database gives it back
    assert fresh.as_api() == by_drf(fresh)
    assert list(fresh.as_api()) == list(by_drf(fresh))  # the same key order too
    assert made.as_api() == by_drf(made)  # as the runner holds it, before any reload


@pytest.mark.django_db
def test_it_names_the_approval_of_a_held_call(agent: Agent) -> None:
    held = record(agent.tenant, status=Status.PENDING_APPROVAL, args={"x": 1})
    approval = ApprovalRequest.objects.create(
        tenant=agent.tenant,
        invocation=held,
        tool=Tool.objects.get(pk=TOOL),
        principal=held.principal,
        requested_by=ApiKey.objects.get(tenant=agent.tenant).user,
        run_id=held.run_id,
        tool_call_id=held.tool_call_id,
        args={"x": 1},
        original_args={"x": 1},
        bound_hash="h",
        expires_at=timezone.now() + timedelta(minutes=5),
    )
    fresh = InvocationRecord.objects.get(pk=held.pk)
    assert fresh.as_api()["approvalId"] == str(approval.pk) == by_drf(fresh)["approvalId"]
    assert fresh.as_api() == by_drf(fresh)


@pytest.mark.django_db
def test_a_call_answers_with_the_records_representation(agent: Agent) -> None:
    body = agent.invoke(TOOL, runId="run-r", idempotencyKey="k-1").json()
    stored = InvocationRecord.objects.get(pk=body["invocationId"])
    assert body == by_drf(stored)
