"""Two tenants, a tenant admin of one, and the setup and dry-run pages' URLs."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from django.contrib.auth.models import User
from django.test import Client

from apps.connections.models import Connection
from apps.tenants.roles import Role, grant_role
from tests.browser.conftest import (  # noqa: F401  (the browser tests' fixtures)
    _async_unsafe_allowed,
    _static_collected,
    browser,
    new_context,
)
from tests.conftest import Agent, make_agent
from tests.connections import make_connection

SETUP_URL = "/admin/policies/policy/setup/"
SIMULATE_URL = "/admin/policies/policy/simulate/"
PRINCIPAL_URL = "/admin/policies/policy/principal/"
PRINCIPALS_URL = "/admin/policies/policy/principals/"
PASSWORD = "pw-setup-admin-123"


@dataclass
class Setting:
    """Tenant acme (an agent with no access yet, a connection to 127.0.0.1) and globex."""

    agent: Agent
    stranger: Agent
    connection: Connection
    foreign_connection: Connection
    admin: User
    operator: User


def build_setting() -> Setting:
    agent = make_agent("acme", "agent:demo")
    stranger = make_agent("globex", "agent:other")
    connection = make_connection(
        agent.tenant, name="local", hosts=("127.0.0.1",), private=True, token="SECRET-setup-1234"
    )
    foreign = make_connection(stranger.tenant, name="globex-crm")
    admin = User.objects.create_user("ada", password=PASSWORD)
    grant_role(admin, agent.tenant, Role.ADMIN)
    operator = User.objects.create_user("otto", password=PASSWORD)
    grant_role(operator, agent.tenant, Role.OPERATOR)
    return Setting(agent, stranger, connection, foreign, admin, operator)


@pytest.fixture
def setting(db: None) -> Setting:
    return build_setting()


def logged_in(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def admin_client(setting: Setting) -> Client:
    return logged_in(setting.admin)
