"""Fixtures for the audit chain tests: the approval tests' tools, caller and operator.

On PostgreSQL the chain is appended when the writing transaction commits (a deferred
constraint trigger); a test run inside a transaction that is rolled back never commits,
so there the trigger is made to fire at the end of each statement instead (the same
function, the same order). Tests with real transactions commit as production does."""

from collections.abc import Iterator

import pytest
from django.db import connection

from tests.approvals.conftest import caller, operator, other, tools  # noqa: F401


@pytest.fixture(autouse=True)
def _linked_per_statement(request: pytest.FixtureRequest) -> Iterator[None]:
    marker = request.node.get_closest_marker("django_db")
    transactional = marker is not None and marker.kwargs.get("transaction", False)
    if marker is not None and not transactional:
        request.getfixturevalue("db")
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SET CONSTRAINTS audit_link_at_commit IMMEDIATE")
    yield
