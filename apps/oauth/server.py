"""toolhub's own OAuth authorization server (TOOLHUB_OAUTH_SERVER), on django-oauth-toolkit.

MCP clients register (RFC 7591, or a client ID metadata document fetched through
toolhub's address guard), send a staff member to the consent page (consent.py), and get
an authorization code (PKCE S256 only), then access and refresh tokens (rotated) bound to
toolhub's resource (RFC 8707). What the consent chose (tenant, principal, resource) is a
Delegation; its tokens act through an API key of its own (models.Delegation), so the
runner, sessions and stream budgets treat them as any key, and revoking a token (RFC 7009)
revokes that key, which ends the chain's open streams.

Access tokens start with ACCESS_PREFIX, so the Bearer path (bearer.py) tells them from
API keys and from an external issuer's JWTs; they work on /mcp/ and the run streams, and
never on the REST API or the admin.
"""

from __future__ import annotations

import hashlib
import secrets
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.db import transaction
from oauth2_provider.cimd import CIMDError, SafeMetadataFetcher
from oauth2_provider.models import AccessToken, Grant, RefreshToken
from oauth2_provider.oauth2_validators import OAuth2Validator
from oauthlib.oauth2.rfc6749 import errors

from apps.connections.netguard import Blocked, NetworkPolicy
from apps.oauth.models import Delegation
from apps.oauth.resource import Refusal
from apps.tenants.models import ApiKey

ACCESS_PREFIX = "thoa_"
REFRESH_PREFIX = "thor_"
GRANT_TYPES = ("authorization_code", "refresh_token")


def access_token(request: Any) -> str:
    return ACCESS_PREFIX + secrets.token_urlsafe(32)


def refresh_token(request: Any) -> str:
    return REFRESH_PREFIX + secrets.token_urlsafe(32)


def checksum(raw: str) -> str:
    return hashlib.sha256(raw.encode("utf-8")).hexdigest()


def issuer_of(resource: str) -> str:
    """The authorization server's issuer for a resource: the resource's origin (its
    metadata is then at /.well-known/oauth-authorization-server, RFC 8414)."""
    parts = urlsplit(resource)
    return f"{parts.scheme}://{parts.netloc}"


LOOPBACK_HOSTS = frozenset({"127.0.0.1", "[::1]", "localhost"})


def plaintext_redirect_problem(uri: str) -> str | None:
    """Why a redirect URI may not be used, or None: `http` only to this machine's
    loopback (RFC 8252 §7.3, what native MCP clients listen on); anything else must be
    `https` (RFC 9700 §2.1: a code sent in clear text over a network can be read)."""
    parts = urlsplit(uri)
    if parts.scheme != "http":
        return None
    host = (parts.hostname or "").lower()
    if f"[{host}]" in LOOPBACK_HOSTS or host in LOOPBACK_HOSTS:
        return None
    return (
        f"The redirect URI {uri!r} is plain http to another machine: use https, or a "
        "loopback address (http://127.0.0.1:<port>/...) for a client on this machine."
    )


class Validator(OAuth2Validator):
    """django-oauth-toolkit's validator, plus the delegation a consent made."""

    def validate_redirect_uri(
        self, client_id: str, redirect_uri: str, request: Any, *args: Any, **kw: Any
    ) -> bool:
        if plaintext_redirect_problem(redirect_uri) is not None:
            return False
        return bool(super().validate_redirect_uri(client_id, redirect_uri, request, *args, **kw))

    def validate_grant_type(
        self, client_id: str, grant_type: str, client: Any, request: Any, *args: Any, **kw: Any
    ) -> bool:
        # Tokens come from a consent only: no client credentials, password or device grant.
        return grant_type in GRANT_TYPES and super().validate_grant_type(
            client_id, grant_type, client, request, *args, **kw
        )

    def is_pkce_required(self, client_id: str, request: Any) -> bool:
        """PKCE with S256, always; an authorization request without it, or with `plain`,
        is refused (invalid_request) before the consent page."""
        if getattr(request, "response_type", None) is not None:
            if not request.code_challenge:
                raise errors.MissingCodeChallengeError(request=request)
            if request.code_challenge_method != "S256":
                raise errors.InvalidRequestError(
                    description="code_challenge_method must be S256 (plain is refused).",
                    request=request,
                )
        return True

    def save_authorization_code(
        self, client_id: str, code: dict[str, Any], request: Any, *args: Any, **kw: Any
    ) -> None:
        super().save_authorization_code(client_id, code, request, *args, **kw)
        tenant, principal = request.toolhub_act_as
        Delegation.objects.create(
            application=request.client,
            user=request.user,
            tenant=tenant,
            principal=principal,
            resource=request.toolhub_resource,
            grant=Grant.objects.get(code=code["code"]),
        )

    def validate_code(
        self, client_id: str, code: str, client: Any, request: Any, *args: Any, **kw: Any
    ) -> bool:
        if not super().validate_code(client_id, code, client, request, *args, **kw):
            return False
        found = Delegation.objects.filter(grant__code=code, application=client).first()
        request.toolhub_delegation = found
        return found is not None

    def validate_refresh_token(
        self, refresh_token: str, client: Any, request: Any, *args: Any, **kw: Any
    ) -> bool:
        if not super().validate_refresh_token(refresh_token, client, request, *args, **kw):
            _revoke_replayed_chain(refresh_token, client)
            return False
        instance = request.refresh_token_instance
        found = Delegation.objects.select_related("key").filter(refresh_token=instance).first()
        if found is None or (found.key is not None and found.key.revoked_at is not None):
            return False
        request.toolhub_delegation = found
        return True

    def _save_bearer_token(
        self, token: dict[str, Any], request: Any, *args: Any, **kw: Any
    ) -> None:
        delegation: Delegation = request.toolhub_delegation
        # The resource the consent bound (RFC 8707): the token's audience, whatever the
        # token request asks (a narrower one cannot be: there is only one).
        request.resource = [delegation.resource]
        super()._save_bearer_token(token, request, *args, **kw)
        delegation.access_token = AccessToken.objects.get(
            token_checksum=checksum(token["access_token"])
        )
        if token.get("refresh_token"):
            delegation.refresh_token = RefreshToken.objects.filter(
                token_checksum=checksum(token["refresh_token"]), revoked__isnull=True
            ).first()
        if delegation.key is None:
            name = f"OAuth client {delegation.application.name or delegation.application.client_id}"
            delegation.key, _secret = ApiKey.objects.issue(
                delegation.tenant, delegation.principal, name=name[:200]
            )
        delegation.grant = None
        delegation.save()

    def revoke_token(
        self, token: str, token_type_hint: str | None, request: Any, *args: Any, **kw: Any
    ) -> None:
        """RFC 7009, then the chain's key is revoked: its streams end (4403) as for any
        revoked key, and no token of the chain is accepted again."""
        application_id = getattr(request.client, "pk", None)
        found = (
            Delegation.objects.of_token(checksum(token), application_id)
            if application_id is not None
            else []
        )
        with transaction.atomic():
            super().revoke_token(token, token_type_hint, request, *args, **kw)
            for delegation in found:
                if delegation.key is not None and delegation.key.revoked_at is None:
                    delegation.key.revoke()


def _revoke_replayed_chain(raw: str, client: Any) -> None:
    """A rotated-away refresh token presented again: the toolkit revokes its family
    (REFRESH_TOKEN_REUSE_PROTECTION); the chain's key goes with it, ending its streams."""
    used = (
        RefreshToken.objects.filter(token_checksum=checksum(raw), application=client)
        .exclude(revoked=None)
        .first()
    )
    if used is None or used.token_family is None:
        return
    chains = Delegation.objects.select_related("key").filter(
        refresh_token__token_family=used.token_family, key__revoked_at=None
    )
    for delegation in chains:
        if delegation.key is not None:
            delegation.key.revoke()


class GuardedMetadataFetcher(SafeMetadataFetcher):
    """Client ID metadata documents are fetched only from public addresses, as toolhub's
    address guard (apps.connections.netguard) judges them, before the toolkit's own
    checks."""

    def fetch(self, client_id: str) -> Any:
        parts = urlsplit(client_id)
        host = parts.hostname or ""
        try:
            NetworkPolicy(allowed_hosts=[host]).safe_address(host, parts.port or 443)
        except (Blocked, OSError) as exc:
            raise CIMDError(f"client_id document refused: {exc}") from None
        return super().fetch(client_id)


def _invalid(description: str) -> Refusal:
    return Refusal(401, "invalid_token", description)


def key_for_access_token(raw: str, resource: str) -> ApiKey:
    """The API key an access token of toolhub's own server acts through; Refusal
    otherwise."""
    if not settings.TOOLHUB_OAUTH_SERVER:
        raise _invalid("toolhub's authorization server is off: its tokens are not accepted.")
    token = (
        AccessToken.objects.select_related("delegation__key__tenant", "delegation__key__user")
        .filter(token_checksum=checksum(raw))
        .first()
    )
    delegation = getattr(token, "delegation", None) if token is not None else None
    if token is None or delegation is None or delegation.key is None:
        raise _invalid("Unknown or revoked access token.")
    if token.is_expired():
        raise _invalid("The access token has expired; refresh it.")
    if token.resource != [resource]:
        raise _invalid(f"The token is for another resource (aud); this one is {resource}.")
    scope = settings.TOOLHUB_OAUTH_SCOPE
    if scope not in token.scope.split():
        raise Refusal(
            403, "insufficient_scope", f"The token does not grant the scope {scope!r}.", scope
        )
    key = delegation.key
    if key.revoked_at is not None:
        raise _invalid(f"The access token is revoked (API key {key.display_prefix}).")
    key.touch()
    return key
