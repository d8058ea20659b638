"""GET /api/v1/connections/: the connections a caller may use, ids and names only."""

from __future__ import annotations

from apps.connections.models import Grant
from tests.conftest import Agent
from tests.connections import grant, make_connection, permit_use, usable

SECRET = "SECRET-token-4b1d-connections-list"


def listed(agent: Agent, **params: str) -> list[dict[str, str]]:
    response = agent.client.get("/api/v1/connections/", params)
    assert response.status_code == 200, response.content
    return response.json()["connections"]


def test_it_lists_a_granted_and_permitted_connection_with_id_name_and_kind_only(agent):
    connection = usable(make_connection(agent.tenant, name="crm", token=SECRET), agent.principal)
    assert listed(agent) == [{"id": str(connection.pk), "name": "crm", "kind": "bearer"}]


def test_it_never_shows_a_secret_or_the_allowed_hosts(agent):
    usable(make_connection(agent.tenant, name="crm", token=SECRET), agent.principal)
    body = agent.client.get("/api/v1/connections/").content.decode()
    assert SECRET not in body
    assert "api.example.com" not in body


def test_it_leaves_out_connections_without_a_grant_or_without_use_connection(agent):
    ungranted = make_connection(agent.tenant, name="ungranted")
    permit_use(ungranted)
    unpermitted = make_connection(agent.tenant, name="unpermitted")
    grant(unpermitted, agent.principal)
    revoked = usable(make_connection(agent.tenant, name="revoked"), agent.principal)
    Grant.objects.filter(connection=revoked).get().revoke()
    other_principal = usable(make_connection(agent.tenant, name="theirs"), "agent:someone-else")
    assert other_principal.name == "theirs"
    assert listed(agent) == []


def test_it_lists_a_run_grant_only_for_that_run(agent):
    connection = make_connection(agent.tenant, name="per-run")
    grant(connection, "", run_id="run-7")
    permit_use(connection)
    assert listed(agent) == []
    assert [c["name"] for c in listed(agent, runId="run-7")] == ["per-run"]


def test_it_never_lists_another_tenants_connection(agent, stranger):
    usable(make_connection(stranger.tenant, name="globex-crm"), stranger.principal)
    # Even a grant naming the agent's principal in the other tenant gives nothing here.
    usable(make_connection(stranger.tenant, name="globex-shared"), agent.principal)
    assert listed(agent) == []
    assert [c["name"] for c in listed(stranger)] == ["globex-crm"]


def test_it_requires_authentication(client):
    assert client.get("/api/v1/connections/").status_code == 401
