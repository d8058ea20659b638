"""Fixtures for the audit chain tests: the approval tests' tools, caller and operator."""

from tests.approvals.conftest import caller, operator, other, tools  # noqa: F401
