"""The run stream with an OAuth access token: the token's audience is toolhub's resource,
which follows the handshake's Host only when that Host is this server's."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator

from apps.oauth import issuers, tokens
from apps.tenants.models import Tenant
from tests.oauth.issuer import LocalIssuer, local_issuer
from toolhub.asgi import application

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def issuer(settings: Any) -> Iterator[LocalIssuer]:
    with local_issuer() as running:
        settings.TOOLHUB_OAUTH_EXTERNAL_ISSUER = running.url
        settings.ALLOWED_HOSTS = ["toolhub.test"]
        issuers.forget_all()
        tokens._TOKEN_KEYS.clear()
        yield running
    issuers.forget_all()
    tokens._TOKEN_KEYS.clear()


async def opens(host: str, token: str) -> Any:
    stream = WebsocketCommunicator(
        application,
        "/ws/v1/runs/run-oauth-ws/",
        headers=[(b"host", host.encode()), (b"authorization", f"Bearer {token}".encode())],
    )
    connected, _ = await stream.connect()
    assert connected  # refusals are accepted, then closed with their code (streams.refuse)
    if await stream.receive_nothing(timeout=0.5):
        await stream.disconnect()
        return "open"
    closing = await stream.receive_output(timeout=1)
    await stream.disconnect()
    return closing.get("code", closing)


async def test_a_token_for_this_server_opens_the_run_stream(issuer):
    await database_sync_to_async(Tenant.objects.create)(slug="acme")
    assert await opens("toolhub.test", issuer.mint("http://toolhub.test/mcp")) == "open"


async def test_a_token_for_another_host_is_refused_even_if_the_host_header_names_it(issuer):
    await database_sync_to_async(Tenant.objects.create)(slug="acme")
    assert await opens("evil.example", issuer.mint("http://evil.example/mcp")) == 4403
    assert await opens("toolhub.test", issuer.mint("http://evil.example/mcp")) == 4403
