"""GET /api/v1/invocations/ reads a page's records and their approvals in a fixed number
of queries, whatever the page's size (issue 45: it made one query per record)."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from apps.approvals.models import ApprovalRequest
from tests.approvals.test_history_paging import decided  # noqa: F401 (a fixture)
from tests.conftest import make_agent

pytestmark = pytest.mark.django_db


def test_a_page_of_records_with_approvals_takes_a_fixed_number_of_queries(decided) -> None:  # noqa: F811
    agent = make_agent("hist", "agent:h")
    agent.client.get("/api/v1/invocations/")  # warm: the key's and the epoch's caches
    with CaptureQueriesContext(connection) as queries:
        page = agent.client.get("/api/v1/invocations/").json()
    assert len(page["results"]) == 50
    approvals = {
        str(i): str(a) for i, a in ApprovalRequest.objects.values_list("invocation_id", "pk")
    }
    assert [r["approvalId"] for r in page["results"]] == [
        approvals[r["invocationId"]] for r in page["results"]
    ]
    assert len(queries) < 10, [q["sql"][:120] for q in queries]
