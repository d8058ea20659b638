"""The official Python MCP SDK's OAuth client (`mcp.client.auth.OAuthClientProvider`)
against toolhub's own authorization server on a real Daphne: discovery from the 401,
dynamic registration, authorization (a signed-in tenant admin's browser session follows
the authorization URL and submits the consent form), the code exchange with PKCE, then
tools/list and tools/call; then a refresh, and a revocation that ends the token's run
stream as revoking an API key does."""

from __future__ import annotations

import asyncio
import html
import re
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx2
import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone
from mcp.client.auth import OAuthClientProvider
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import (
    AuthorizationCodeResult,
    OAuthClientInformationFull,
    OAuthClientMetadata,
    OAuthToken,
)
from oauth2_provider.models import AccessToken

from apps.invocations import revocations
from apps.invocations.models import InvocationRecord, Status
from apps.oauth.models import Delegation
from apps.tenants.models import ApiKey, Tenant
from apps.tenants.roles import Role, grant_role
from tests.conftest import allow
from tests.streams.conftest import open_ws
from tests.streams.test_revocation import closed_within
from tests.support.server import Server, daphne

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.server, pytest.mark.one_leg]

REDIRECT = "http://127.0.0.1:33418/callback"
HIDDEN = re.compile(r'<input type="hidden" name="([^"]+)" value="([^"]*)"')
FIRST_CHOICE = re.compile(r'name="act_as" id="act-as-1" value="([^"]+)"')


@pytest.fixture
def server(transactional_db: None) -> Iterator[Server]:
    with daphne({"TOOLHUB_OAUTH_SERVER": "1"}) as base:
        yield base


@pytest.fixture
def session_cookie(transactional_db: None) -> str:
    """A tenant admin of acme, signed in: the browser session that consents."""
    tenant = Tenant.objects.create(slug="acme")
    allow(tenant, "core__get_current_time")
    ApiKey.objects.issue(tenant, "agent:helper")
    user = User.objects.create_user("ada", password="pw", is_staff=True)
    grant_role(user, tenant, Role.ADMIN)
    staff = Client()
    staff.force_login(user)
    return staff.cookies["sessionid"].value


class Storage:
    def __init__(self) -> None:
        self.tokens: OAuthToken | None = None
        self.client: OAuthClientInformationFull | None = None

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.client = client_info


class Browser:
    """The staff member's browser: follows the authorization URL, submits the consent form
    and hands the code from the redirect to the SDK's callback handler."""

    def __init__(self, server: Server, cookie: str) -> None:
        self.server, self.cookie = server, cookie
        self.result: AuthorizationCodeResult | None = None
        self.pages: list[str] = []

    async def consent(self, url: str, redirect: str = REDIRECT) -> str:
        """Follow the authorization URL, allow the first choice; the redirect it sends."""
        async with httpx2.AsyncClient(
            cookies={"sessionid": self.cookie}, timeout=30, follow_redirects=False
        ) as browser:
            page = await browser.get(url)
            assert page.status_code == 200, page.text
            self.pages.append(page.text)
            form = {name: html.unescape(value) for name, value in HIDDEN.findall(page.text)}
            choice = FIRST_CHOICE.search(page.text)
            assert choice is not None, page.text
            form.update(act_as=html.unescape(choice.group(1)), allow="on")
            posted = await browser.post(f"{self.server}/oauth/authorize/", data=form)
        assert posted.status_code == 302, posted.text
        location = str(posted.headers["location"])
        assert location.startswith(redirect)
        return location

    async def redirect_handler(self, url: str) -> None:
        query = parse_qs(urlsplit(await self.consent(url)).query)
        # `iss` too (RFC 9207): the SDK refuses a response without it once the metadata
        # says the server sends it.
        self.result = AuthorizationCodeResult(
            code=query["code"][0],
            state=query.get("state", [None])[0],
            iss=query.get("iss", [None])[0],
        )

    async def callback_handler(self) -> AuthorizationCodeResult:
        assert self.result is not None
        result, self.result = self.result, None
        return result


async def list_and_call(server: Server, auth: OAuthClientProvider) -> tuple[list[str], Any]:
    async with (
        httpx2.AsyncClient(auth=auth, timeout=30) as http,
        streamable_http_client(f"{server}/mcp/", http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        tools = await session.list_tools()
        result = await session.call_tool("core__get_current_time", {"timezone": "UTC"})
        return [tool.name for tool in tools.tools], result


def test_the_sdk_client_signs_in_lists_calls_refreshes_and_is_revoked(server, session_cookie):
    storage, browser = Storage(), Browser(server, session_cookie)
    provider = OAuthClientProvider(
        server_url=f"{server}/mcp",
        client_metadata=OAuthClientMetadata(
            client_name="SDK test client",
            redirect_uris=[REDIRECT],
            grant_types=["authorization_code", "refresh_token"],
            response_types=["code"],
            token_endpoint_auth_method="none",
        ),
        storage=storage,
        redirect_handler=browser.redirect_handler,
        callback_handler=browser.callback_handler,
    )
    names, result = asyncio.run(asyncio.wait_for(list_and_call(server, provider), 90))
    assert names == ["core__get_current_time"]
    assert result.is_error is False
    # The consent page showed the client, the tenant, the principal and its tools.
    page = browser.pages[0]
    assert "SDK test client" in page and "acme" in page and "agent:helper" in page
    assert "core__get_current_time" in page
    record = InvocationRecord.objects.get()
    assert (record.tenant.slug, record.principal, record.status) == (
        "acme",
        "agent:helper",
        Status.SUCCEEDED,
    )
    assert storage.tokens is not None and storage.client is not None
    first = storage.tokens

    # The access token expires: the SDK refreshes it (rotation: a new refresh token too)
    # without sending anyone to the consent page again.
    AccessToken.objects.update(expires=timezone.now() - timedelta(seconds=1))
    provider.context.token_expiry_time = time.time() - 1  # the client's clock agrees
    names, _ = asyncio.run(asyncio.wait_for(list_and_call(server, provider), 90))
    assert names == ["core__get_current_time"]
    assert len(browser.pages) == 1
    assert storage.tokens.access_token != first.access_token
    assert storage.tokens.refresh_token != first.refresh_token

    # A stream opened with the token ends when the token is revoked (RFC 7009).
    token = storage.tokens.access_token
    headers = {"Authorization": f"Bearer {token}"}
    with open_ws(server, "/ws/v1/runs/run-oauth/", headers) as ws:
        revoked = httpx2.post(
            f"{server}/oauth/revoke/",
            data={"token": token, "client_id": storage.client.client_id},
            timeout=10,
        )
        assert revoked.status_code == 200
        assert closed_within(ws, revocations.RECHECK_S + 5) == 4403
    refused = httpx2.post(
        f"{server}/mcp/",
        json={"jsonrpc": "2.0", "id": 1, "method": "ping"},
        headers={"Authorization": f"Bearer {token}", "Accept": "application/json"},
        timeout=10,
    )
    assert refused.status_code == 401
    assert 'error="invalid_token"' in refused.headers["www-authenticate"]
    assert Delegation.objects.get().key.revoked_at is not None
    assert "Traceback" not in server.output()
