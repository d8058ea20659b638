"""The console's history pages by keyset (issue 45): no page counts, and a page deep in the
history makes the same queries as the first."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime, timedelta
from html import unescape
from urllib.parse import unquote

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from apps.approvals.models import ApprovalRequest, ApprovalStatus
from apps.invocations.models import InvocationRecord
from apps.tenants.models import Tenant
from apps.tools.models import Tool
from apps.tools.registry import registry

pytestmark = pytest.mark.django_db

OLDER = re.compile(r'href="\?[^"]*before=([^"&]+)"')


@pytest.fixture
def decided() -> list[ApprovalRequest]:
    """120 decided approvals; pairs share a created_at, so the id breaks ties."""
    Tool.objects.sync_registry(registry)
    tenant = Tenant.objects.create(slug="hist", name="Hist")
    admin = User.objects.create_superuser("hist-admin", "h@example.com", "pw")
    start = datetime(2026, 1, 1, tzinfo=UTC)
    made = []
    for i in range(120):
        record = InvocationRecord.objects.create(
            tenant=tenant,
            tool_ref="core__get_current_time",
            tool_call_id=f"call-{i}",
            run_id="run-h",
            principal="agent:h",
            status="succeeded",
        )
        made.append(
            ApprovalRequest(
                tenant=tenant,
                invocation=record,
                tool_id="core__get_current_time",
                status=ApprovalStatus.SUCCEEDED,
                principal="agent:h",
                requested_by=admin,
                run_id="run-h",
                tool_call_id=f"call-{i}",
                args={},
                original_args={},
                bound_hash="0" * 64,
                hold_reason="test",
                expires_at=start + timedelta(days=1),
                decided_by=admin,
                decided_at=start,
            )
        )
    ApprovalRequest.objects.bulk_create(made)
    for i, approval in enumerate(made):
        ApprovalRequest.objects.filter(pk=approval.pk).update(
            created_at=start + timedelta(seconds=i // 2)
        )
    return list(ApprovalRequest.objects.order_by("-created_at", "-id"))


@pytest.fixture
def console(decided: list[ApprovalRequest]) -> Client:
    client = Client()
    client.force_login(User.objects.get(username="hist-admin"))
    return client


def shown(page: str, approvals: list[ApprovalRequest]) -> list[ApprovalRequest]:
    return sorted(
        (a for a in approvals if f"/console/approvals/{a.pk}/" in page),
        key=lambda a: page.index(f"/console/approvals/{a.pk}/"),
    )


def test_the_history_pages_through_every_decision_once_in_order(decided, console) -> None:
    walked: list[ApprovalRequest] = []
    queries_per_page = []
    params: dict[str, str] = {}
    while True:
        with CaptureQueriesContext(connection) as queries:
            response = console.get("/console/history/", params)
        assert response.status_code == 200
        page = response.content.decode()
        walked += shown(page, decided)
        queries_per_page.append(len(queries))
        assert not [q for q in queries if "COUNT(" in q["sql"].upper()]
        older = OLDER.search(page)
        if older is None:
            break
        params = {"before": unquote(unescape(older.group(1)))}
    assert [a.pk for a in walked] == [a.pk for a in decided]
    assert len(queries_per_page) == 3  # 50, 50, 20
    assert len(set(queries_per_page)) == 1  # a deep page costs what the first does


def test_a_forged_position_is_refused_with_a_clear_message(console) -> None:
    for forged in (
        "garbage",
        "2026-01-01T00:00:00~not-a-uuid",
        f"2026-01-01T00:00:00~{uuid.uuid4()}",
    ):
        response = console.get("/console/history/", {"before": forged})
        assert response.status_code == 400
        assert "Invalid 'before'" in response.content.decode()
