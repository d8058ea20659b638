"""Tokens of an OpenID provider nobody here wrote (oidc-provider, tests/identity) on a real
Daphne: the official Python MCP SDK client lists and calls tools with one, the run
stream opens with one and ends when its key is revoked; a token for another audience,
and one of another issuer, are refused with RFC 6750 errors."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client

from apps.invocations import revocations
from apps.invocations.models import InvocationRecord, Status
from apps.oauth.models import TokenKey
from apps.tenants.models import Tenant
from tests.conftest import allow
from tests.identity.provider import OpenIDProvider, oidc_provider, openid_provider
from tests.streams.conftest import open_ws
from tests.streams.test_revocation import closed_within
from tests.support.server import Server, daphne

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.server, pytest.mark.one_leg]

__all__ = ["oidc_provider"]


@pytest.fixture
def server(transactional_db: None, oidc_provider: OpenIDProvider) -> Iterator[Server]:
    with daphne({"TOOLHUB_OAUTH_EXTERNAL_ISSUER": oidc_provider.issuer}) as base:
        yield base


@pytest.fixture
def alice(oidc_provider: OpenIDProvider, server: Server) -> str:
    """A user of the provider whose tokens name tenant acme; her token for toolhub."""
    tenant = Tenant.objects.create(slug="acme")
    allow(tenant, "core__get_current_time")
    oidc_provider.add_resource(f"{server}/mcp", scope="mcp")
    oidc_provider.set_user("alice", "pw-alice", token_claims={"toolhub_tenant": "acme"})
    return oidc_provider.access_token("alice", "pw-alice", resource=f"{server}/mcp")


def post(server: Server, token: str | None) -> httpx2.Response:
    headers = {"Accept": "application/json, text/event-stream"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    return httpx2.post(f"{server}/mcp/", json=ping, headers=headers, timeout=10)


def challenge(response: httpx2.Response) -> dict[str, str]:
    _, _, rest = response.headers["www-authenticate"].partition(" ")
    return {
        name.strip(): value.strip('"')
        for name, value in (part.split("=", 1) for part in rest.split('", '))
    }


async def list_and_call(server: Server, token: str) -> tuple[list[str], Any]:
    headers = {"Authorization": f"Bearer {token}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=30) as http,
        streamable_http_client(f"{server}/mcp/", http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        tools = await session.list_tools()
        result = await session.call_tool("core__get_current_time", {"timezone": "UTC"})
        return [tool.name for tool in tools.tools], result


def test_the_sdk_client_lists_and_calls_with_the_providers_token(server, alice, oidc_provider):
    refused = post(server, None)
    assert refused.status_code == 401
    metadata_url = challenge(refused)["resource_metadata"]
    assert metadata_url == f"{server}/.well-known/oauth-protected-resource/mcp"
    metadata = httpx2.get(metadata_url, timeout=10).json()
    assert metadata["resource"] == f"{server}/mcp"
    assert metadata["authorization_servers"] == [oidc_provider.issuer]

    names, result = asyncio.run(asyncio.wait_for(list_and_call(server, alice), 60))
    assert names == ["core__get_current_time"]
    assert result.is_error is False
    record = InvocationRecord.objects.get()
    assert (record.tenant.slug, record.principal, record.status) == (
        "acme",
        "oauth:alice",
        Status.SUCCEEDED,
    )
    assert "Traceback" not in server.output()


def test_the_run_stream_opens_with_a_token_and_ends_when_its_key_is_revoked(server, alice):
    headers = {"Authorization": f"Bearer {alice}"}
    with open_ws(server, "/ws/v1/runs/run-oauth/", headers) as ws:
        TokenKey.objects.get().key.revoke()
        assert closed_within(ws, revocations.RECHECK_S + 5) == 4403
    # Its tokens are refused from then on, on /mcp/ as on the streams.
    refused = post(server, alice)
    assert refused.status_code == 401
    assert "are revoked in tenant acme" in challenge(refused)["error_description"]


def test_a_token_for_another_audience_or_issuer_is_refused(server, alice, oidc_provider):
    elsewhere = "http://127.0.0.1:9/elsewhere"
    oidc_provider.add_resource(elsewhere, scope="mcp")
    other_audience = oidc_provider.access_token("alice", "pw-alice", resource=elsewhere)
    refused = post(server, other_audience)
    assert refused.status_code == 401
    found = challenge(refused)
    assert found["error"] == "invalid_token"
    assert found["error_description"] == (
        f"The token is for another resource (aud); this one is {server}/mcp."
    )
    assert refused.json()["error"]["message"] == (
        f"Authentication required: Authorization: Bearer <API key>. {found['error_description']}"
    )

    with openid_provider() as stranger:
        stranger.add_resource(f"{server}/mcp", scope="mcp")
        stranger.set_user("alice", "pw-alice", token_claims={"toolhub_tenant": "acme"})
        foreign = stranger.access_token("alice", "pw-alice", resource=f"{server}/mcp")
    refused = post(server, foreign)
    assert refused.status_code == 401
    assert challenge(refused)["error_description"] == (
        f"The token's issuer (iss) is not {oidc_provider.issuer}."
    )
    assert not InvocationRecord.objects.exists()
