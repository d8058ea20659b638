"""toolhub's own authorization server (apps/oauth/server.py), in process: registration,
consent, code + PKCE, tokens bound to the resource, and each bad input refused with its
OAuth error. The whole flow with the official MCP SDK client on Daphne is in
test_own_server_sdk.py."""

from __future__ import annotations

import base64
import hashlib
import secrets
from datetime import timedelta
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone
from oauth2_provider.cimd import CIMDError
from oauth2_provider.models import AccessToken, Application

from apps.oauth import bearer, server
from apps.oauth.models import Delegation
from apps.oauth.resource import Refusal
from apps.tenants.models import ApiKey, Tenant
from apps.tenants.roles import Role, grant_role
from tests.conftest import allow

# The OAuth protocol, not the database: one leg.
pytestmark = [pytest.mark.django_db, pytest.mark.one_leg]

RESOURCE = "http://testserver/mcp"
REDIRECT = "http://127.0.0.1:33418/callback"


@pytest.fixture(autouse=True)
def server_on(settings: Any) -> None:
    settings.TOOLHUB_OAUTH_SERVER = True


@pytest.fixture
def acme() -> Tenant:
    tenant = Tenant.objects.create(slug="acme")
    allow(tenant, "core__get_current_time")
    ApiKey.objects.issue(tenant, "agent:helper")
    return tenant


@pytest.fixture
def admin(acme: Tenant) -> Client:
    user = User.objects.create_user("ada", password="pw", is_staff=True)
    grant_role(user, acme, Role.ADMIN)
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def client_id() -> str:
    return register()


def register(redirect_uris: list[str] | None = None) -> str:
    response = Client().post(
        "/oauth/register/",
        {
            "client_name": "Test client",
            "redirect_uris": redirect_uris or [REDIRECT],
            "grant_types": ["authorization_code", "refresh_token"],
            "response_types": ["code"],
            "token_endpoint_auth_method": "none",
        },
        content_type="application/json",
    )
    assert response.status_code == 201, response.content
    return str(response.json()["client_id"])


def pkce() -> tuple[str, str]:
    verifier = secrets.token_urlsafe(48)
    digest = hashlib.sha256(verifier.encode()).digest()
    return verifier, base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def authorize_query(client_id: str, challenge: str, **extra: str) -> str:
    params = {
        "response_type": "code",
        "client_id": client_id,
        "redirect_uri": REDIRECT,
        "code_challenge": challenge,
        "code_challenge_method": "S256",
        "state": "st-1",
        "scope": "mcp",
        "resource": RESOURCE,
        **extra,
    }
    return "/oauth/authorize/?" + urlencode(params)


def consent(staff: Client, client_id: str, challenge: str, allow_it: bool = True) -> Any:
    page = staff.get(authorize_query(client_id, challenge))
    assert page.status_code == 200, page.content
    form = page.context["form"]
    data = {name: form[name].value() or "" for name in form.fields if name != "allow"}
    data["act_as"] = page.context["choices"][0].value
    if allow_it:
        data["allow"] = "on"
    return staff.post("/oauth/authorize/", data)


def code_of(response: Any) -> str:
    assert response.status_code == 302, response.content
    query = parse_qs(urlsplit(response["Location"]).query)
    assert query["state"] == ["st-1"]
    assert query["iss"] == ["http://testserver"]  # RFC 9207: the metadata's issuer
    return query["code"][0]


def token(data: dict[str, str]) -> Any:
    return Client().post("/oauth/token/", data)


def exchange(client_id: str, code: str, verifier: str) -> Any:
    return token(
        {
            "grant_type": "authorization_code",
            "code": code,
            "redirect_uri": REDIRECT,
            "client_id": client_id,
            "code_verifier": verifier,
            "resource": RESOURCE,
        }
    )


@pytest.fixture
def tokens(admin: Client, client_id: str) -> dict[str, Any]:
    verifier, challenge = pkce()
    response = exchange(client_id, code_of(consent(admin, client_id, challenge)), verifier)
    assert response.status_code == 200, response.content
    return dict(response.json())


def test_the_consent_page_shows_client_tenant_principal_and_tools(admin, client_id):
    _, challenge = pkce()
    page = admin.get(authorize_query(client_id, challenge))
    html = page.content.decode()
    assert page.status_code == 200
    assert "Test client" in html and "acme" in html and "agent:helper" in html
    assert "core__get_current_time" in html


def test_a_token_acts_as_the_chosen_principal_for_the_resource_only(tokens):
    assert tokens["access_token"].startswith(server.ACCESS_PREFIX)
    assert tokens["refresh_token"].startswith(server.REFRESH_PREFIX)
    key = bearer.key_for(f"Bearer {tokens['access_token']}", RESOURCE)
    assert (key.tenant.slug, key.principal) == ("acme", "agent:helper")
    delegation = Delegation.objects.get()
    assert delegation.key == key and delegation.resource == RESOURCE

    # A token for another resource (audience) is refused.
    with pytest.raises(Refusal) as refused:
        bearer.key_for(f"Bearer {tokens['access_token']}", "http://elsewhere.test/mcp")
    assert refused.value.error == "invalid_token"
    assert "another resource" in refused.value.description


def test_denying_sends_access_denied(admin, client_id):
    _, challenge = pkce()
    response = consent(admin, client_id, challenge, allow_it=False)
    assert response.status_code == 302
    query = parse_qs(urlsplit(response["Location"]).query)
    assert query["error"] == ["access_denied"] and query["iss"] == ["http://testserver"]
    assert not Delegation.objects.exists()


def test_a_replayed_code_is_refused(admin, client_id):
    verifier, challenge = pkce()
    code = code_of(consent(admin, client_id, challenge))
    assert exchange(client_id, code, verifier).status_code == 200
    replayed = exchange(client_id, code, verifier)
    assert replayed.status_code == 400
    assert replayed.json()["error"] == "invalid_grant"


def test_a_pkce_verifier_that_does_not_match_is_refused(admin, client_id):
    _, challenge = pkce()
    code = code_of(consent(admin, client_id, challenge))
    wrong = exchange(client_id, code, secrets.token_urlsafe(48))
    assert wrong.status_code == 400
    assert wrong.json()["error"] == "invalid_grant"
    assert not Delegation.objects.filter(access_token__isnull=False).exists()


def test_plain_pkce_is_refused(admin, client_id):
    page = admin.get(authorize_query(client_id, "a" * 43, code_challenge_method="plain"))
    location = urlsplit(page["Location"]) if page.status_code == 302 else None
    assert location is not None, page.content
    query = parse_qs(location.query)
    assert query["error"] == ["invalid_request"]
    assert "plain" in query["error_description"][0] or "method" in query["error_description"][0]


def test_a_missing_pkce_challenge_is_refused(admin, client_id):
    page = admin.get(authorize_query(client_id, ""))
    assert page.status_code == 302
    assert parse_qs(urlsplit(page["Location"]).query)["error"] == ["invalid_request"]


def test_a_redirect_uri_not_registered_is_refused_without_redirecting(admin, client_id):
    _, challenge = pkce()
    page = admin.get(
        authorize_query(client_id, challenge, redirect_uri="http://evil.test/callback")
    )
    assert page.status_code == 400
    assert page.context["error"].error == "invalid_request"
    assert "Mismatching redirect URI" in page.content.decode()
    assert "evil.test" not in page.get("Location", "")


def test_a_token_for_another_resource_cannot_be_asked_for(admin, client_id):
    _, challenge = pkce()
    page = admin.get(authorize_query(client_id, challenge, resource="http://elsewhere.test/mcp"))
    assert page.status_code == 400
    assert page.context["error"]["error"] == "invalid_target"


def test_an_expired_token_is_refused(tokens):
    AccessToken.objects.update(expires=timezone.now() - timedelta(seconds=1))
    with pytest.raises(Refusal) as refused:
        bearer.key_for(f"Bearer {tokens['access_token']}", RESOURCE)
    assert (refused.value.status, refused.value.error) == (401, "invalid_token")
    assert "expired" in refused.value.description


def refresh(client_id: str, refresh_token: str) -> Any:
    return token(
        {"grant_type": "refresh_token", "refresh_token": refresh_token, "client_id": client_id}
    )


def test_refresh_rotates_and_a_replayed_refresh_token_ends_the_chain(client_id, tokens):
    refreshed = refresh(client_id, tokens["refresh_token"])
    assert refreshed.status_code == 200, refreshed.content
    new = refreshed.json()
    assert new["refresh_token"] != tokens["refresh_token"]
    key = bearer.key_for(f"Bearer {new['access_token']}", RESOURCE)
    assert key == Delegation.objects.get().key  # the same chain, the same key
    with pytest.raises(Refusal):  # the old access token went with its refresh token
        bearer.key_for(f"Bearer {tokens['access_token']}", RESOURCE)

    # The rotated-away refresh token again: refused, and the whole chain is revoked.
    again = refresh(client_id, tokens["refresh_token"])
    assert again.status_code == 400 and again.json()["error"] == "invalid_grant"
    key.refresh_from_db()
    assert key.revoked_at is not None
    with pytest.raises(Refusal):
        bearer.key_for(f"Bearer {new['access_token']}", RESOURCE)
    assert refresh(client_id, new["refresh_token"]).json()["error"] == "invalid_grant"


def test_a_revoked_token_is_refused_and_its_key_revoked(client_id, tokens):
    key = bearer.key_for(f"Bearer {tokens['access_token']}", RESOURCE)
    revoked = Client().post(
        "/oauth/revoke/", {"token": tokens["access_token"], "client_id": client_id}
    )
    assert revoked.status_code == 200
    key.refresh_from_db()
    assert key.revoked_at is not None  # its streams end as any revoked key's do
    with pytest.raises(Refusal) as refused:
        bearer.key_for(f"Bearer {tokens['access_token']}", RESOURCE)
    assert (refused.value.status, refused.value.error) == (401, "invalid_token")
    assert refresh(client_id, tokens["refresh_token"]).json()["error"] == "invalid_grant"


def test_a_token_on_the_rest_api_or_the_admin_is_refused(tokens):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {tokens['access_token']}"}
    api = Client().get("/api/v1/tools/", **headers)
    assert api.status_code == 401
    assert "not on the REST API" in api.json()["detail"]
    assert 'error="invalid_token"' in api["WWW-Authenticate"]
    admin_page = Client().get("/admin/", **headers)
    assert admin_page.status_code == 302 and "/admin/login/" in admin_page["Location"]


def test_an_operator_cannot_consent(acme, client_id):
    user = User.objects.create_user("otto", password="pw", is_staff=True)
    grant_role(user, acme, Role.OPERATOR)
    staff = Client()
    staff.force_login(user)
    _, challenge = pkce()
    page = staff.get(authorize_query(client_id, challenge))
    assert page.status_code == 403
    assert "not a tenant admin" in page.context["refusal"]
    form = page.context["form"]
    data = {name: form[name].value() or "" for name in form.fields if name != "allow"}
    data.update(act_as=f"{acme.pk} agent:helper", allow="on")
    posted = staff.post("/oauth/authorize/", data)
    assert posted.status_code == 403
    assert not Delegation.objects.exists()


def test_a_client_metadata_document_at_a_private_address_is_refused(admin):
    _, challenge = pkce()
    page = admin.get(authorize_query("https://127.0.0.1/client.json", challenge))
    assert page.status_code == 400
    assert page.context["error"].error == "invalid_request"
    assert "Invalid client_id" in page.content.decode()
    assert not Application.objects.filter(client_id__startswith="https://").exists()


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("https://127.0.0.1/client.json", "a private or loopback address"),
        ("https://10.1.2.3:8443/client.json", "a private or loopback address"),
        ("https://169.254.169.254/latest/client.json", "a cloud metadata address"),
    ],
)
def test_the_address_guard_refuses_a_metadata_document_fetch(url, problem):
    with pytest.raises(CIMDError) as refused:
        server.GuardedMetadataFetcher().fetch(url)
    assert problem in str(refused.value)


def test_the_metadata_lists_the_server_when_it_is_on(settings):
    resource = Client().get("/.well-known/oauth-protected-resource/mcp").json()
    assert resource["authorization_servers"] == ["http://testserver"]
    metadata = Client().get("/.well-known/oauth-authorization-server").json()
    assert metadata["issuer"] == "http://testserver"
    assert metadata["code_challenge_methods_supported"] == ["S256"]
    assert metadata["registration_endpoint"] == "http://testserver/oauth/register/"
    assert metadata["client_id_metadata_document_supported"] is True
    assert metadata["authorization_response_iss_parameter_supported"] is True
    settings.TOOLHUB_OAUTH_SERVER = False
    assert Client().get("/.well-known/oauth-authorization-server").status_code == 404
    off = Client().get("/.well-known/oauth-protected-resource/mcp").json()
    assert off["authorization_servers"] == []


def test_nothing_of_another_tenant_is_offered_or_accepted(admin, client_id):
    globex = Tenant.objects.create(slug="globex")
    ApiKey.objects.issue(globex, "agent:spy")
    _, challenge = pkce()
    page = admin.get(authorize_query(client_id, challenge))
    assert [c.tenant.slug for c in page.context["choices"]] == ["acme"]
    assert "globex" not in page.content.decode() and "agent:spy" not in page.content.decode()
    form = page.context["form"]
    data = {name: form[name].value() or "" for name in form.fields if name != "allow"}
    data.update(act_as=f"{globex.pk} agent:spy", allow="on")
    forged = admin.post("/oauth/authorize/", data)
    assert forged.status_code == 403
    assert not Delegation.objects.exists()


@pytest.mark.parametrize(
    "uri", ["http://evil.test/callback", "http://10.0.0.5:8080/cb", "http://127.0.0.1.evil.test/"]
)
def test_a_plain_http_redirect_to_another_machine_is_refused(uri):
    response = Client().post(
        "/oauth/register/",
        {"client_name": "Remote", "redirect_uris": [uri], "token_endpoint_auth_method": "none"},
        content_type="application/json",
    )
    assert response.status_code == 400
    assert response.json()["error"] == "invalid_redirect_uri"
    assert "use https" in response.json()["error_description"]


@pytest.mark.parametrize(
    "uri",
    ["http://127.0.0.1:9/cb", "http://localhost:9/cb", "http://[::1]:9/cb", "https://a.test/"],
)
def test_loopback_and_https_redirects_register(uri):
    assert register([uri])


def test_an_http_redirect_to_another_machine_never_gets_a_code(admin):
    # Registered before the check (or by hand): the authorization endpoint refuses it too.
    from oauth2_provider.models import Application

    app = Application.objects.create(
        name="Old",
        client_type=Application.CLIENT_PUBLIC,
        authorization_grant_type=Application.GRANT_AUTHORIZATION_CODE,
        redirect_uris="http://evil.test/callback",
    )
    _, challenge = pkce()
    page = admin.get(
        authorize_query(app.client_id, challenge, redirect_uri="http://evil.test/callback")
    )
    assert page.status_code == 400
    assert "evil.test" not in page.get("Location", "")
