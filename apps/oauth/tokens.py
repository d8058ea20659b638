"""OAuth access tokens as Bearer credentials: checked, then mapped to the API key their
principal acts through (models.TokenKey).

A token from the external issuer (TOOLHUB_OAUTH_EXTERNAL_ISSUER) is a JWT: its issuer
exactly the configured one (RFC 9207), its audience toolhub's resource (RFC 8707), within
`exp`/`nbf`, signed with an asymmetric algorithm by a key of the issuer's JWKS (never
`none`, never an HMAC, which a public key would let anyone forge), and carrying the scope
TOOLHUB_OAUTH_SCOPE. Its tenant and principal come from TOOLHUB_OAUTH_TENANT_CLAIM and
TOOLHUB_OAUTH_PRINCIPAL_CLAIM; a tenant that does not exist is refused, never created.
"""

from __future__ import annotations

from typing import Any

import jwt
from django.conf import settings

from apps.oauth import issuers
from apps.oauth.models import TokenKey
from apps.oauth.resource import Refusal
from apps.tenants.epoch import EpochCache
from apps.tenants.models import PRINCIPAL_RE, ApiKey, Tenant
from apps.tenants.principals import UnmappablePrincipal

# Asymmetric only: with an HMAC algorithm the issuer's public key would be the secret.
ALGORITHMS = {
    "RS256": "RSA", "RS384": "RSA", "RS512": "RSA",
    "PS256": "RSA", "PS384": "RSA", "PS512": "RSA",
    "ES256": "EC", "ES384": "EC", "ES512": "EC",
    "EdDSA": "OKP",
}  # fmt: skip
LEEWAY_S = 30  # clock skew between toolhub and the issuer
PRINCIPAL_KIND = "oauth"  # a claim that is not already 'kind:name' becomes 'oauth:<value>'

# (issuer, tenant slug, principal) -> the key its tokens act through, as of the epoch.
_TOKEN_KEYS = EpochCache("oauth token keys")


def _invalid(description: str) -> Refusal:
    return Refusal(401, "invalid_token", description)


def key_for_token(raw: str, resource: str) -> ApiKey:
    """The API key an access token acts through, or Refusal saying what is wrong."""
    issuer_url = settings.TOOLHUB_OAUTH_EXTERNAL_ISSUER
    if not issuer_url:
        raise _invalid("Invalid or revoked API key.")  # no tokens are accepted: only keys
    claims = verify(raw, issuer_url, resource)
    granted = _scopes(claims)
    if settings.TOOLHUB_OAUTH_SCOPE not in granted:
        raise Refusal(
            403,
            "insufficient_scope",
            f"The token does not grant the scope {settings.TOOLHUB_OAUTH_SCOPE!r}.",
            scope=settings.TOOLHUB_OAUTH_SCOPE,
        )
    slug = claims.get(settings.TOOLHUB_OAUTH_TENANT_CLAIM)
    if not isinstance(slug, str) or not slug:
        raise _invalid(f"The token names no tenant ({settings.TOOLHUB_OAUTH_TENANT_CLAIM} claim).")
    principal = principal_of(claims.get(settings.TOOLHUB_OAUTH_PRINCIPAL_CLAIM))
    key = _TOKEN_KEYS.get((issuer_url, slug, principal), lambda: _key(issuer_url, slug, principal))
    if key.revoked_at is not None:
        raise _invalid(
            f"Tokens of {principal} from this issuer are revoked in tenant {slug} (API key "
            f"{key.display_prefix})."
        )
    key.touch()
    return key


def verify(raw: str, issuer_url: str, resource: str) -> dict[str, Any]:
    """The claims of a JWT access token, checked; Refusal naming the first fault."""
    try:
        header = jwt.get_unverified_header(raw)
        unverified = jwt.decode(raw, options={"verify_signature": False})
    except jwt.PyJWTError:
        raise _invalid("Not a toolhub API key (th_...) nor a JWT access token.") from None
    if unverified.get("iss") != issuer_url:
        raise _invalid(f"The token's issuer (iss) is not {issuer_url}.")
    alg = header.get("alg")
    if alg not in ALGORITHMS:
        allowed = ", ".join(ALGORITHMS)
        raise _invalid(f"Tokens signed with {alg!r} are not accepted (only {allowed}).")
    kid = header.get("kid")
    if not isinstance(kid, str):
        raise _invalid("The token names no signing key (kid).")
    jwk = issuers.issuer(issuer_url).signing_key(kid)
    if jwk.kty != ALGORITHMS[alg] or (jwk.alg or alg) != alg:
        raise _invalid(f"The token's algorithm {alg} does not fit its signing key {kid!r}.")
    try:
        return jwt.decode(
            raw,
            jwk.key,
            algorithms=[alg],
            audience=resource,
            issuer=issuer_url,
            leeway=LEEWAY_S,
            options={"require": ["exp", "iss", "aud"], "strict_aud": False},
        )
    except jwt.ExpiredSignatureError:
        raise _invalid("The token has expired (exp).") from None
    except jwt.ImmatureSignatureError:
        raise _invalid("The token is not valid yet (nbf/iat).") from None
    except jwt.InvalidAudienceError:
        raise _invalid(
            f"The token is for another resource (aud); this one is {resource}."
        ) from None
    except jwt.InvalidIssuerError:
        raise _invalid(f"The token's issuer (iss) is not {issuer_url}.") from None
    except jwt.MissingRequiredClaimError as exc:
        raise _invalid(f"The token has no {exc.claim} claim.") from None
    except jwt.InvalidSignatureError:
        raise _invalid("The token's signature does not verify.") from None
    except jwt.PyJWTError as exc:
        raise _invalid(f"The token is malformed ({exc}).") from None


def _scopes(claims: dict[str, Any]) -> set[str]:
    """`scope` (RFC 9068: space-separated) or `scp` (a list, as Okta and Entra send)."""
    scope, scp = claims.get("scope"), claims.get("scp")
    found = set(scope.split()) if isinstance(scope, str) else set()
    if isinstance(scp, list):
        found.update(item for item in scp if isinstance(item, str))
    elif isinstance(scp, str):
        found.update(scp.split())
    return found


def principal_of(value: Any) -> str:
    """The principal a claim names: itself when it is 'kind:name', else 'oauth:<value>'."""
    if isinstance(value, str) and value:
        principal = value if PRINCIPAL_RE.fullmatch(value) else f"{PRINCIPAL_KIND}:{value}"
        if PRINCIPAL_RE.fullmatch(principal):
            return principal
    claim = settings.TOOLHUB_OAUTH_PRINCIPAL_CLAIM
    raise _invalid(
        f"The token's {claim} claim cannot be a principal (letters, digits, . _ @ + -, "
        "at most 120 characters)."
    )


def _key(issuer_url: str, slug: str, principal: str) -> ApiKey:
    tenant = Tenant.objects.filter(slug=slug).first()
    if tenant is None:
        raise _invalid(f"The token's tenant {slug!r} does not exist in toolhub.")
    try:
        return TokenKey.objects.key_for(issuer_url, tenant, principal)
    except UnmappablePrincipal as exc:
        raise _invalid(f"The token's principal cannot be served: {exc.messages[0]}") from None
