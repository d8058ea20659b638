"""Admin lists of tables that grow with traffic (issue 45): no full count, bounded search.

The paginator counts at most its cap (a LIMIT subquery), the history tables are searched
by whole ids only, and a search that matches nothing says why in the page.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.contrib import admin
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from apps.invocations.admin import InvocationRecordAdmin
from apps.invocations.models import InvocationRecord
from apps.tenants.admin import TenantScopedAdmin
from apps.tenants.models import Tenant
from toolhub.web.paging import CappedCountPaginator

pytestmark = pytest.mark.django_db

RECORDS = "/admin/invocations/invocationrecord/"


@pytest.fixture
def records() -> list[InvocationRecord]:
    """75 records of one tenant, a second apart, newest last."""
    tenant = Tenant.objects.create(slug="bulk", name="Bulk")
    start = datetime(2026, 1, 1, tzinfo=UTC)
    made = InvocationRecord.objects.bulk_create(
        InvocationRecord(
            id=uuid.uuid4(),
            tenant=tenant,
            tool_ref="core__get_current_time",
            tool_call_id=f"call-{i}",
            run_id=f"run-{i}",
            principal="agent:bulk",
            status="succeeded",
        )
        for i in range(75)
    )
    for i, record in enumerate(made):  # auto_now_add: set the times afterwards
        InvocationRecord.objects.filter(pk=record.pk).update(
            created_at=start + timedelta(seconds=i)
        )
    return made


@pytest.fixture
def root(django_user_model: Any) -> Client:
    client = Client()
    client.force_login(django_user_model.objects.create_superuser("root", "r@example.com", "pw"))
    return client


@pytest.fixture
def small_pages(monkeypatch: pytest.MonkeyPatch) -> None:
    """A cap of 30 rows, 10 a page: three pages, whatever more the table holds."""
    monkeypatch.setattr(CappedCountPaginator, "cap", 30)
    monkeypatch.setattr(InvocationRecordAdmin, "list_per_page", 10)


def ids_on(page: str) -> set[str]:
    """The records a changelist page shows, by run id (its run column)."""
    return {r.run_id for r in InvocationRecord.objects.all() if f">{r.run_id}<" in page}


def test_every_admin_pages_without_counting_the_whole_table() -> None:
    for model_admin in admin.site._registry.values():
        if isinstance(model_admin, TenantScopedAdmin):
            assert model_admin.show_full_result_count is False, type(model_admin)
            assert issubclass(model_admin.paginator, CappedCountPaginator), type(model_admin)


def test_a_long_list_pages_up_to_the_cap_and_says_so(records, root, small_pages) -> None:
    with CaptureQueriesContext(connection) as queries:
        first = root.get(RECORDS)
    assert first.status_code == 200
    counts = [q["sql"] for q in queries if "COUNT(" in q["sql"].upper()]
    assert counts and all("LIMIT 31" in sql for sql in counts), counts
    assert "More than 30 rows match" in first.content.decode()

    # Newest first, 10 a page, up to the cap's third page; the fourth is refused (?e=1).
    pages = [root.get(RECORDS, {"p": str(n)}) for n in (1, 2, 3)]
    assert [p.status_code for p in pages] == [200, 200, 200]
    seen = [sorted(ids_on(p.content.decode())) for p in pages]
    assert sum(len(s) for s in seen) == 30
    assert set().union(*map(set, seen)) == {f"run-{i}" for i in range(45, 75)}
    beyond = root.get(RECORDS, {"p": "4"})
    assert beyond.status_code == 302 and "e=1" in beyond["Location"]


def test_a_narrowed_list_is_counted_exactly(records, root, small_pages) -> None:
    page = root.get(RECORDS, {"q": "run-7"}).content.decode()
    assert "More than" not in page
    assert ids_on(page) == {"run-7"}


def test_the_records_list_is_searched_by_whole_ids_only(records, root) -> None:
    with CaptureQueriesContext(connection) as queries:
        found = root.get(RECORDS, {"q": "call-12"}).content.decode()
    assert ids_on(found) == {"run-12"}
    assert not [q for q in queries if " LIKE " in q["sql"].upper()], [q["sql"] for q in queries]

    # Part of a principal: it would mean reading every row, so it matches nothing, and
    # the page says how this list is searched.
    with CaptureQueriesContext(connection) as queries:
        response = root.get(RECORDS, {"q": "bulk"})
    page = response.content.decode()
    assert response.status_code == 200
    assert ids_on(page) == set()
    assert "This list is searched by whole ids only" in page
    assert not [q for q in queries if " LIKE " in q["sql"].upper()], [q["sql"] for q in queries]


def test_the_history_tables_search_only_exact_fields() -> None:
    bounded = [a for a in admin.site._registry.values() if getattr(a, "exact_search_only", False)]
    assert {a.model._meta.label_lower for a in bounded} >= {
        "invocations.invocationrecord",
        "invocations.runevent",
        "approvals.approvalrequest",
    }
    for model_admin in bounded:
        assert all(field.startswith("=") for field in model_admin.search_fields), model_admin
