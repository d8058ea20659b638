import pytest

from tests.conftest import allow

pytestmark = pytest.mark.django_db(transaction=True)


def test_it_runs_the_clock_tool(agent):
    response = agent.invoke("core__get_current_time", args={"timezone": "Europe/Paris"})
    assert response.status_code == 200, response.content
    assert response.json()["ok"] is True


def test_it_runs_a_test_tool(agent, test_tools):
    allow(agent.tenant, "test__echo")
    response = agent.invoke("test__echo", args={"text": "hi", "secret_note": "s3cret"})
    body = response.json()
    assert body["result"] == {"text": "hi"}
    assert body["args"] == {"text": "hi"}
