"""The OpenID provider harness itself (tests/identity/provider.py): what other tests rely
on, checked against the provider's own discovery and JWKS."""

from __future__ import annotations

from typing import Any

import jwt
import pytest

from tests.identity.provider import OpenIDProvider, ProviderError, oidc_provider

pytestmark = [pytest.mark.one_leg]

__all__ = ["oidc_provider"]

RESOURCE = "http://127.0.0.1:9/mcp/"


def verify(provider: OpenIDProvider, token: str, audience: str) -> dict[str, Any]:
    keys = jwt.PyJWKSet.from_dict(provider.jwks())
    kid = jwt.get_unverified_header(token)["kid"]
    key = next(k for k in keys.keys if k.key_id == kid)
    return jwt.decode(token, key, algorithms=["RS256"], audience=audience, issuer=provider.issuer)


def test_discovery_names_the_issuer_and_rfc9207(oidc_provider: OpenIDProvider) -> None:
    found = oidc_provider.discovery()
    assert found["issuer"] == oidc_provider.issuer
    assert found["authorization_response_iss_parameter_supported"] is True
    assert found["end_session_endpoint"] == f"{oidc_provider.issuer}/session/end"
    assert "groups" in found["claims_supported"]


def test_user_token_for_a_resource(oidc_provider: OpenIDProvider) -> None:
    oidc_provider.add_resource(RESOURCE, scope="mcp", ttl=120)
    oidc_provider.set_user(
        "alice", "pw-alice", token_claims={"tenant": "acme"}, groups=["toolhub-acme-admins"]
    )
    token = oidc_provider.access_token("alice", "pw-alice", RESOURCE)
    claims = verify(oidc_provider, token, RESOURCE)
    assert claims["sub"] == "alice"
    assert claims["scope"] == "mcp"
    assert claims["tenant"] == "acme"
    assert claims["exp"] - claims["iat"] == 120


def test_id_token_carries_groups(oidc_provider: OpenIDProvider) -> None:
    oidc_provider.set_user("bob", "pw-bob", groups=["g1", "g2"], email="bob@example.com")
    answer = oidc_provider.authorize("bob", "pw-bob", scope="openid groups email")
    claims = verify(oidc_provider, answer["id_token"], "test-token-client")
    assert claims["groups"] == ["g1", "g2"]
    assert claims["email"] == "bob@example.com"


def test_client_credentials_token(oidc_provider: OpenIDProvider) -> None:
    oidc_provider.add_resource(RESOURCE)
    claims = verify(oidc_provider, oidc_provider.client_token(RESOURCE), RESOURCE)
    assert claims["sub"] == "test-token-client"


def test_refusals(oidc_provider: OpenIDProvider) -> None:
    oidc_provider.set_user("carol", "pw-carol")
    with pytest.raises(ProviderError, match="Wrong username or password"):
        oidc_provider.authorize("carol", "wrong")
    with pytest.raises(ProviderError, match="invalid_target"):
        oidc_provider.client_token("http://127.0.0.1:9/not-registered/")
