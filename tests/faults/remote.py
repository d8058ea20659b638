"""Steps the fault test runs against its own PostgreSQL server, in a process of their
own (`python -m tests.faults.remote STEP ARGS`, DATABASE_URL set): the test's Django
connection points at the suite's database, not at the one it restarts."""

from __future__ import annotations

import json
import sys

import django


def seed() -> dict[str, object]:
    from apps.tools.models import Tool
    from apps.tools.registry import registry
    from tests.approvals import tools as approval_tools
    from tests.approvals.support import TEST_TOOLS, make_operator
    from tests.conftest import allow, make_agent

    for contract in approval_tools.CONTRACTS:
        if registry.get(contract.id) is None:
            registry.register(contract)
    Tool.objects.sync_registry(registry)
    agent = make_agent("acme")
    allow(agent.tenant, *TEST_TOOLS, name="test tools")
    make_operator("olga", agent.tenant)  # password pw-olga-12345
    return {"key": agent.key}


def approve(*approval_ids: str) -> dict[str, object]:
    from django.contrib.auth.models import User

    from apps.approvals import decisions
    from apps.tenants.models import Tenant
    from tests.approvals.support import make_operator

    operator = User.objects.filter(username="olga").first() or make_operator(
        "olga", Tenant.objects.get(slug="acme")
    )
    for approval_id in approval_ids:
        decisions.decide(approval_id, operator, "approve")
    return {"approved": len(approval_ids)}


def sweep() -> dict[str, int]:
    from apps.approvals import tasks

    return tasks.sweep()


if __name__ == "__main__":
    django.setup()
    step, *args = sys.argv[1:]
    steps = {"seed": seed, "approve": approve, "sweep": sweep}
    sys.stdout.write(json.dumps(steps[step](*args)) + "\n")
