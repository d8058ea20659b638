from __future__ import annotations

import pytest
from django.test import Client

from tests.admin.support import World, build_world


@pytest.fixture
def world(db: None) -> World:
    return build_world()


@pytest.fixture
def staff_client(world: World) -> Client:
    """Tenant acme's staff member, with every model permission, logged in."""
    client = Client()
    client.force_login(world.staff)
    return client


@pytest.fixture
def root_client(world: World) -> Client:
    client = Client()
    client.force_login(world.superuser)
    return client
