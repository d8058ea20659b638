"""The approval tests' personas and tools (a caller in `acme`, `globex`, an operator)."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client

from tests.approvals.conftest import caller, operator, other, tools  # noqa: F401
from tests.browser.conftest import (  # noqa: F401
    _async_unsafe_allowed,
    _static_collected,
    browser,
    make_operator,
    new_context,
)


@pytest.fixture
def console(operator: User) -> Client:  # noqa: F811
    client = Client()
    client.force_login(operator)
    return client
