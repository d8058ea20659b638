"""OAuth access tokens from an external issuer on the REST API: the checks toolhub makes
(issuer, audience, expiry, signature and algorithm, scope, tenant and principal claims),
each refused with a clear RFC 6750 error, and nothing of another tenant reachable."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from collections.abc import Iterator
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from rest_framework.test import APIClient

from apps.invocations.models import InvocationRecord
from apps.oauth import issuers, tokens
from apps.oauth.models import TokenKey
from apps.tenants.models import ApiKey, Tenant
from tests.conftest import allow
from tests.oauth.issuer import LocalIssuer, local_issuer

# Token checks, not the database: one leg.
pytestmark = [pytest.mark.django_db, pytest.mark.one_leg]

RESOURCE = "http://testserver/mcp"
CLOCK = {"toolId": "core__get_current_time", "args": {}}
# The longest principal there is (a 32-character kind, a 120-character name).
LONGEST = "k" * 32 + ":" + "n" * 120


@pytest.fixture(scope="module")
def issuer() -> Iterator[LocalIssuer]:
    with local_issuer() as running:
        yield running


@pytest.fixture(autouse=True)
def accept_tokens(settings: Any, issuer: LocalIssuer) -> Iterator[None]:
    settings.TOOLHUB_OAUTH_EXTERNAL_ISSUER = issuer.url
    issuers.forget_all()
    tokens._TOKEN_KEYS.clear()
    yield
    issuers.forget_all()
    tokens._TOKEN_KEYS.clear()


@pytest.fixture
def acme() -> Tenant:
    tenant = Tenant.objects.create(slug="acme")
    allow(tenant, "core__get_current_time")
    return tenant


def bearer(token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


def challenge(response: Any) -> dict[str, str]:
    scheme, _, rest = response["WWW-Authenticate"].partition(" ")
    assert scheme == "Bearer"
    return {
        name.strip(): value.strip('"')
        for name, value in (part.split("=", 1) for part in rest.split('", '))
    }


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def unsigned(issuer: LocalIssuer, alg: str, key: bytes = b"") -> str:
    """A token with this header alg, signed (HMAC) with `key` or not at all."""
    header = b64(json.dumps({"alg": alg, "kid": issuer.kid, "typ": "JWT"}).encode())
    claims = jwt.decode(issuer.mint(RESOURCE), options={"verify_signature": False})
    body = b64(json.dumps(claims).encode())
    signature = b""
    if key:
        signature = hmac.new(key, f"{header}.{body}".encode(), hashlib.sha256).digest()
    return f"{header}.{body}.{b64(signature)}"


def public_pem(issuer: LocalIssuer) -> bytes:
    return issuer.key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def tampered(token: str) -> str:
    header, body, signature = token.split(".")
    claims = json.loads(base64.urlsafe_b64decode(body + "=="))
    claims["sub"] = "agent:someone-else"
    return f"{header}.{b64(json.dumps(claims).encode())}.{signature}"


# ---------------------------------------------------------------- accepted


def test_a_token_acts_as_its_principal_in_its_tenant(acme, issuer):
    client = bearer(issuer.mint(RESOURCE))
    response = client.post("/api/v1/invocations/", CLOCK, format="json")
    assert response.status_code == 200, response.json()
    record = InvocationRecord.objects.get()
    assert (record.tenant, record.principal) == (acme, "agent:support-bot")
    # One key per (issuer, tenant, principal), whose secret nobody holds; reused.
    assert bearer(issuer.mint(RESOURCE)).get("/api/v1/tools/").status_code == 200
    key = TokenKey.objects.get().key
    assert ApiKey.objects.get() == key and key.name == f"OAuth tokens of {issuer.url}"


def test_a_subject_that_is_not_kind_name_becomes_an_oauth_principal(acme, issuer):
    response = bearer(issuer.mint(RESOURCE, sub="00u1abc")).post(
        "/api/v1/invocations/", CLOCK, format="json"
    )
    assert response.status_code == 200
    assert InvocationRecord.objects.get().principal == "oauth:00u1abc"


def test_scp_as_a_list_grants_the_scope(acme, issuer):
    token = issuer.mint(RESOURCE, scope=None, scp=["openid", "mcp"])
    assert bearer(token).get("/api/v1/tools/").status_code == 200


# ---------------------------------------------------------------- refused


def _now() -> int:
    return int(time.time())


BAD_TOKENS: dict[str, tuple[Any, str]] = {
    "wrong issuer": (
        lambda i: i.mint(RESOURCE, iss="https://issuer.example"),
        "The token's issuer (iss) is not",
    ),
    "wrong audience": (
        lambda i: i.mint("http://testserver/other"),
        "The token is for another resource (aud); this one is http://testserver/mcp.",
    ),
    "expired": (lambda i: i.mint(RESOURCE, exp=_now() - 120), "The token has expired (exp)."),
    "not yet valid": (
        lambda i: i.mint(RESOURCE, nbf=_now() + 600),
        "The token is not valid yet (nbf/iat).",
    ),
    "no expiry": (lambda i: i.mint(RESOURCE, exp=None), "The token has no exp claim."),
    "signature": (
        lambda i: tampered(i.mint(RESOURCE)),
        "The token's signature does not verify.",
    ),
    "alg none": (lambda i: unsigned(i, "none"), "Tokens signed with 'none' are not accepted"),
    "HS256 keyed with the public key": (
        lambda i: unsigned(i, "HS256", public_pem(i)),
        "Tokens signed with 'HS256' are not accepted",
    ),
    "unknown signing key": (
        lambda i: jwt.encode(
            jwt.decode(i.mint(RESOURCE), options={"verify_signature": False}),
            i.key,
            algorithm="ES256",
            headers={"kid": "made-up"},
        ),
        "The token's signing key 'made-up' is not one of the issuer's.",
    ),
    "tenant that does not exist": (
        lambda i: i.mint(RESOURCE, toolhub_tenant="nowhere"),
        "The token's tenant 'nowhere' does not exist in toolhub.",
    ),
    "no tenant": (
        lambda i: i.mint(RESOURCE, toolhub_tenant=None),
        "The token names no tenant (toolhub_tenant claim).",
    ),
    "principal too long": (
        lambda i: i.mint(RESOURCE, sub="agent:" + "n" * 121),
        "The token's sub claim cannot be a principal",
    ),
    "not a JWT": (lambda i: "not-a-token", "Not a toolhub API key (th_...) nor a JWT"),
}


@pytest.mark.parametrize("case", list(BAD_TOKENS))
def test_a_bad_token_is_refused_with_its_reason(acme, issuer, case):
    make, reason = BAD_TOKENS[case]
    response = bearer(make(issuer)).post("/api/v1/invocations/", CLOCK, format="json")
    assert response.status_code == 401
    assert response.json()["detail"].startswith(reason), response.json()
    found = challenge(response)
    assert found["error"] == "invalid_token"
    assert found["error_description"].startswith(reason.replace('"', "'"))
    assert found["resource_metadata"] == (
        "http://testserver/.well-known/oauth-protected-resource/mcp"
    )
    assert not InvocationRecord.objects.exists()
    assert not ApiKey.objects.exists()


def test_a_token_without_the_scope_is_403_insufficient_scope(acme, issuer):
    response = bearer(issuer.mint(RESOURCE, scope="openid profile")).get("/api/v1/tools/")
    assert response.status_code == 403
    assert response.json() == {"detail": "The token does not grant the scope 'mcp'."}
    assert challenge(response)["error"] == "insufficient_scope"
    assert challenge(response)["scope"] == "mcp"


def test_a_made_up_key_id_does_not_reread_the_keys_every_time(acme, issuer):
    assert bearer(issuer.mint(RESOURCE)).get("/api/v1/tools/").status_code == 200
    before = issuer.fetches
    made_up = BAD_TOKENS["unknown signing key"][0](issuer)
    for _ in range(3):
        assert bearer(made_up).get("/api/v1/tools/").status_code == 401
    assert issuer.fetches == before


def test_a_rotated_key_is_read_again(acme, issuer, monkeypatch):
    monkeypatch.setattr(issuers, "REFRESH_MIN_S", 0.0)
    assert bearer(issuer.mint(RESOURCE)).get("/api/v1/tools/").status_code == 200
    old = (issuer.key, issuer.kid)
    try:
        issuer.key, issuer.kid = type(issuer)(issuer.url).key, "local-2"
        assert bearer(issuer.mint(RESOURCE)).get("/api/v1/tools/").status_code == 200
    finally:
        issuer.key, issuer.kid = old


def test_revoking_the_principals_key_refuses_its_tokens(acme, issuer):
    assert bearer(issuer.mint(RESOURCE)).get("/api/v1/tools/").status_code == 200
    TokenKey.objects.get().key.revoke()
    response = bearer(issuer.mint(RESOURCE)).get("/api/v1/tools/")
    assert response.status_code == 401
    assert "are revoked in tenant acme" in response.json()["detail"]


def test_no_issuer_configured_accepts_no_token(acme, issuer, settings):
    settings.TOOLHUB_OAUTH_EXTERNAL_ISSUER = ""
    response = bearer(issuer.mint(RESOURCE)).get("/api/v1/tools/")
    assert response.status_code == 401
    assert response.json() == {"detail": "Invalid or revoked API key."}


def test_the_resource_setting_is_the_audience(acme, issuer, settings):
    settings.TOOLHUB_OAUTH_RESOURCE = "https://toolhub.example.com/mcp"
    assert bearer(issuer.mint(RESOURCE)).get("/api/v1/tools/").status_code == 401
    token = issuer.mint("https://toolhub.example.com/mcp")
    assert bearer(token).get("/api/v1/tools/").status_code == 200


# ---------------------------------------------------------------- tenants and pages


def test_the_longest_principal_in_two_tenants_never_crosses(acme, issuer):
    globex = Tenant.objects.create(slug="globex")
    allow(globex, "core__get_current_time")
    in_acme = bearer(issuer.mint(RESOURCE, sub=LONGEST))
    in_globex = bearer(issuer.mint(RESOURCE, sub=LONGEST, toolhub_tenant="globex"))
    assert in_acme.post("/api/v1/invocations/", CLOCK, format="json").status_code == 200
    record = InvocationRecord.objects.get()
    assert (record.tenant, record.principal) == (acme, LONGEST)
    # globex's principal of the same name sees none of acme's records.
    assert in_globex.get("/api/v1/invocations/").json()["results"] == []
    assert in_globex.get(f"/api/v1/invocations/{record.pk}/").status_code == 404
    assert in_globex.post("/api/v1/invocations/", CLOCK, format="json").status_code == 200
    keys = {key.tenant.slug: key for key in ApiKey.objects.all()}
    assert keys["acme"].user != keys["globex"].user  # one service user per (tenant, principal)
    assert keys["acme"].user.username.endswith("@acme")
    assert keys["globex"].user.username.endswith("@globex")


@pytest.mark.parametrize("page", ["/admin/", "/admin/tenants/apikey/", "/console/"])
def test_a_token_does_not_open_the_staff_pages(acme, issuer, page):
    response = bearer(issuer.mint(RESOURCE)).get(page)
    assert response.status_code == 302
    assert "/login/" in response["Location"]


# ---------------------------------------------------------------- metadata


@pytest.mark.parametrize(
    "path",
    ["/.well-known/oauth-protected-resource/mcp", "/.well-known/oauth-protected-resource"],
)
def test_the_protected_resource_metadata_names_the_issuer(issuer, path, client):
    response = client.get(path)
    assert response.status_code == 200
    assert response.json() == {
        "resource": RESOURCE,
        "authorization_servers": [issuer.url],
        "scopes_supported": ["mcp"],
        "bearer_methods_supported": ["header"],
        "resource_name": "toolhub",
    }
    assert response["Access-Control-Allow-Origin"] == "*"


def test_a_401_without_credentials_points_to_the_metadata(client):
    response = client.get("/api/v1/tools/")
    assert response.status_code == 401
    found = challenge(response)
    assert "error" not in found  # no credential, no error code (RFC 6750 3.1)
    path = found["resource_metadata"].removeprefix("http://testserver")
    assert client.get(path).json()["resource"] == RESOURCE
