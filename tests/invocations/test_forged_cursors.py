"""A cursor and a page size are the client's input: nonsense in them is a 400, never a 500."""

from __future__ import annotations

import base64

import pytest
from django.contrib.auth.models import User
from rest_framework.test import APIClient

from tests.conftest import CORE_TOOLS

INVOCATIONS = "/api/v1/invocations/"
APPROVALS = "/api/v1/approvals/"


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


FORGED = {
    "not base64": "%%%not-base64%%%",
    "base64 of nonsense": b64("hello world"),
    "a position that is no date": b64("p=yesterday"),
    "a naive date": b64("p=2024-01-01 00:00:00"),
    "an impossible date": b64("p=2024-13-45 00:00:00+00:00"),
    "a date past the calendar's end": b64("p=9999-12-31 23:59:59-14:00"),
    "a negative offset": b64("o=-5&p=2024-01-01 00:00:00+00:00"),
    "a non-numeric reverse flag": b64("r=yes"),
    "a huge offset": b64("o=" + "9" * 500),
    "a huge position": b64("p=" + "2" * 100_000),
    "non-ascii": "ü" * 10,
}


@pytest.fixture
def operator_client(agent) -> APIClient:
    user = User.objects.create_user("opal", password="pw-opal-123", is_staff=True)
    agent.tenant.members.add(user)
    client = APIClient()
    client.force_login(user)
    return client


@pytest.mark.parametrize("cursor", FORGED.values(), ids=FORGED.keys())
def test_it_answers_a_forged_invocations_cursor_with_400(agent, cursor):
    agent.invoke(CORE_TOOLS[0], args={})
    response = agent.client.get(INVOCATIONS, {"cursor": cursor})
    assert response.status_code == 400, response.content
    assert response.json()["errors"][0]["field"] == "cursor"


@pytest.mark.parametrize("cursor", FORGED.values(), ids=FORGED.keys())
def test_it_answers_a_forged_approvals_cursor_with_400(operator_client, cursor):
    response = operator_client.get(APPROVALS, {"cursor": cursor})
    assert response.status_code == 400, response.content
    assert response.json()["errors"][0]["field"] == "cursor"


@pytest.mark.parametrize("size", ["0", "-1", "201", "abc", "1.5", "9" * 40, ""])
def test_it_answers_a_page_size_outside_1_to_200_with_400(agent, size):
    response = agent.client.get(INVOCATIONS, {"pageSize": size})
    assert response.status_code == 400, response.content
    assert response.json()["errors"] == [
        {"field": "pageSize", "message": "an integer from 1 to 200"}
    ]


def test_it_still_follows_its_own_next_links(agent):
    created = [agent.invoke(CORE_TOOLS[0], args={}).json()["invocationId"] for _ in range(3)]
    page = agent.client.get(INVOCATIONS, {"pageSize": 1}).json()
    seen = [r["invocationId"] for r in page["results"]]
    while page["next"]:
        response = agent.client.get(page["next"])
        assert response.status_code == 200
        page = response.json()
        seen += [r["invocationId"] for r in page["results"]]
    assert seen == list(reversed(created))
    previous = agent.client.get(
        agent.client.get(INVOCATIONS, {"pageSize": 1}).json()["next"]
    ).json()["previous"]
    assert agent.client.get(previous).status_code == 200
