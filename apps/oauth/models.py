"""What OAuth access tokens act through: an API key of the token's principal.

Everything that serves a principal (the runner's caller, MCP sessions, the open-stream
budget, revocation that ends streams) is keyed by an API key. A token from an issuer is
mapped to its (tenant, principal) and acts through one key per (issuer, tenant,
principal), made on first use and never shown to anyone: its secret is dropped at
creation, so only tokens reach it. Staff see it among the tenant's API keys; revoking it
refuses that issuer's tokens for the principal and ends their open streams, as for any key.
"""

from __future__ import annotations

from django.db import IntegrityError, models, transaction

from apps.tenants.models import ApiKey, Tenant


class TokenKeyManager(models.Manager["TokenKey"]):
    def key_for(self, issuer: str, tenant: Tenant, principal: str) -> ApiKey:
        """The key this issuer's tokens for the principal act through (made on first use;
        UnmappablePrincipal when the principal cannot have a service user of its own)."""
        found = self._find(issuer, tenant, principal)
        if found is not None:
            return found
        try:
            with transaction.atomic():
                name = f"OAuth tokens of {issuer}"[:200]
                key, _secret = ApiKey.objects.issue(tenant, principal, name=name)
                self.create(issuer=issuer, tenant=tenant, principal=principal, key=key)
                return key
        except IntegrityError:  # another request made it first
            found = self._find(issuer, tenant, principal)
            if found is None:
                raise
            return found

    def _find(self, issuer: str, tenant: Tenant, principal: str) -> ApiKey | None:
        row = (
            self.select_related("key__tenant", "key__user")
            .filter(issuer=issuer, tenant=tenant, principal=principal)
            .first()
        )
        return row.key if row is not None else None


class TokenKey(models.Model):
    issuer = models.CharField(max_length=500)
    # No index of its own: the (tenant, principal, issuer) unique constraint leads with it.
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+", db_index=False)
    principal = models.CharField(max_length=160)
    key = models.OneToOneField(ApiKey, on_delete=models.CASCADE, related_name="token_key")
    created_at = models.DateTimeField(auto_now_add=True)

    objects = TokenKeyManager()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "principal", "issuer"], name="oauth_one_key_per_principal"
            )
        ]
        verbose_name = "OAuth token key"

    def __str__(self) -> str:
        return f"{self.principal} @ {self.tenant_id} from {self.issuer}"


class DelegationQuerySet(models.QuerySet["Delegation"]):
    def of_token(self, checksum: str, application_id: int) -> list[Delegation]:
        """The delegations an access or refresh token (by its checksum) of this client
        belongs to."""
        by_access = models.Q(access_token__token_checksum=checksum)
        by_refresh = models.Q(refresh_token__token_checksum=checksum)
        return list(
            self.select_related("key")
            .filter(by_access | by_refresh, application_id=application_id)
            .distinct()
        )


class Delegation(models.Model):
    """A consent given on toolhub's own authorization server (apps.oauth.server): a staff
    member let a client act as a principal of a tenant, for one resource.

    The grant (while its code is unused), then the current access and refresh token of the
    chain point here; refreshing moves the pointers to the new pair. Its tokens act through
    an API key of its own, made when the first token is issued: revoking a token revokes
    that key, which ends the chain's open streams as revoking any key does.
    """

    application = models.ForeignKey(
        "oauth2_provider.Application", on_delete=models.CASCADE, related_name="+"
    )
    user = models.ForeignKey(
        "auth.User", on_delete=models.CASCADE, related_name="oauth_delegations"
    )
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    principal = models.CharField(max_length=160)
    resource = models.CharField(max_length=500)
    key = models.OneToOneField(
        ApiKey, on_delete=models.CASCADE, null=True, blank=True, related_name="delegation"
    )
    grant = models.OneToOneField(
        "oauth2_provider.Grant",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="delegation",
    )
    access_token = models.OneToOneField(
        "oauth2_provider.AccessToken",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="delegation",
    )
    refresh_token = models.OneToOneField(
        "oauth2_provider.RefreshToken",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="delegation",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    objects = DelegationQuerySet.as_manager()

    def __str__(self) -> str:
        return f"{self.application_id} as {self.principal} @ {self.tenant_id}"
