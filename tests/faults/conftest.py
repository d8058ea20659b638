"""The approval tests' fixtures (a caller allowed the test tools, an operator)."""

from tests.approvals.conftest import caller, operator, tally, tools

__all__ = ["caller", "operator", "tally", "tools"]
