"""Shared fixtures: personas (a tenant's agent, a stranger tenant, staff), keys, tools."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from django.contrib.auth.models import User
from guardian.shortcuts import assign_perm
from rest_framework.test import APIClient

from apps.policies.models import Policy
from apps.tenants.models import ApiKey, Tenant
from apps.tenants.principals import agents_group
from apps.tools.models import Tool
from apps.tools.registry import registry
from tests.support import tools as support_tools
from tests.support.hashers import use_quick_hasher
from tests.support.threads import close_executor_connections

LEGS = ("sqlite", "postgresql")


def pytest_configure(config: pytest.Config) -> None:
    from django.conf import settings

    use_quick_hasher(settings)  # tests/support/hashers.py: seconds a user otherwise


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The gate runs the suite on SQLite and on PostgreSQL side by side (scripts/test sets
    TOOLHUB_TEST_LEG). A module marked `one_leg` is not about the database (MCP interop,
    parsers, wire formats): it runs on one of the two legs only, SQLite's (the embedded
    default, and the leg that ends first), or the one the marker names
    (`pytest.mark.one_leg("postgresql")`). Outside the gate (no TOOLHUB_TEST_LEG) every
    test runs."""
    leg = os.environ.get("TOOLHUB_TEST_LEG")
    if not leg:
        return
    if leg not in LEGS:
        raise pytest.UsageError(f"TOOLHUB_TEST_LEG={leg!r}: expected one of {', '.join(LEGS)}")
    keep: list[pytest.Item] = []
    elsewhere: list[pytest.Item] = []
    for item in items:
        marker = item.get_closest_marker("one_leg")
        if marker is None:
            keep.append(item)
            continue
        home = marker.args[0] if marker.args else LEGS[0]
        if home not in LEGS:
            raise pytest.UsageError(f"{item.nodeid}: one_leg({home!r}) is not a leg")
        (keep if home == leg else elsewhere).append(item)
    if elsewhere:
        config.hook.pytest_deselected(items=elsewhere)
        items[:] = keep


@dataclass
class Agent:
    """An API caller: a tenant, a principal, its key and a client that sends it."""

    tenant: Tenant
    principal: str
    key: str
    client: APIClient

    def invoke(self, tool_id: str, **body: Any) -> Any:
        return self.client.post("/api/v1/invocations/", {"toolId": tool_id, **body}, format="json")

    def tools(self, **params: str) -> Any:
        return self.client.get("/api/v1/tools/", params)


def make_agent(slug: str, principal: str = "agent:test") -> Agent:
    tenant, _ = Tenant.objects.get_or_create(slug=slug, defaults={"name": slug.title()})
    _, raw = ApiKey.objects.issue(tenant, principal)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return Agent(tenant=tenant, principal=principal, key=raw, client=client)


def allow(tenant: Tenant, *tool_ids: str, name: str = "allow") -> Policy:
    """A policy listing the tools, and `execute_tool` on them for the tenant's agents."""
    policy, _ = Policy.objects.get_or_create(tenant=tenant, name=name)
    tools = list(Tool.objects.filter(pk__in=tool_ids))
    policy.tools.add(*tools)
    group = agents_group(tenant)
    for tool in tools:
        assign_perm("tools.execute_tool", group, tool)
    return policy


CORE_TOOLS = [
    "core__get_current_time",
    "core__planning_setup_plan",
    "core__planning_add_step",
    "core__planning_update_step",
    "core__planning_read_plan",
]


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup: None) -> Iterator[None]:
    """pytest-django's, and before it drops the test database: this process's call-lease
    liveness lock closed (apps.invocations.leases.Life: a connection of its own, held for
    the process's life, would keep the database from being dropped)."""
    from apps.invocations import leases

    yield
    leases.life.close()


@pytest.fixture(autouse=True)
def _shared_thread_connections() -> Iterator[None]:
    """After each test, asgiref's shared thread gives back its database connections: an
    async test's `sync_to_async` work runs there and nothing else closes them, so on
    PostgreSQL the last one kept a session open on the test database at the end."""
    yield
    close_executor_connections()


@pytest.fixture
def agent(db: None) -> Agent:
    """Tenant `acme`'s agent, with a policy allowing every built-in tool."""
    agent = make_agent("acme")
    allow(agent.tenant, *CORE_TOOLS)
    return agent


@pytest.fixture
def stranger(db: None) -> Agent:
    """Another tenant's agent, with its own policy allowing the same tools."""
    other = make_agent("globex", "agent:other")
    allow(other.tenant, *CORE_TOOLS)
    return other


@pytest.fixture
def bare_agent(db: None) -> Agent:
    """An agent of a tenant that has no policy at all."""
    return make_agent("initech", "agent:lonely")


@pytest.fixture
def staff(db: None) -> User:
    return User.objects.create_user("olivia", password="pw-olivia-123", is_staff=True)


@pytest.fixture
def test_tools(db: None) -> Iterator[list[str]]:
    """Registers tests/support/tools.py's tools and syncs them into the catalog."""
    ids = []
    for contract in support_tools.CONTRACTS:
        if registry.get(contract.id) is None:
            registry.register(contract)
        ids.append(contract.id)
    Tool.objects.sync_registry(registry)
    yield ids
    for tool_id in ids:
        registry.unregister(tool_id)
    Tool.objects.sync_registry(registry)
