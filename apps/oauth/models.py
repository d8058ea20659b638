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
