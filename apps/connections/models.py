"""Connections and grants: external credentials, referenced by opaque id only.

A connection's secret is encrypted at rest and decrypted only inside the broker
when a capability is built for a call (CONNECTION_ID_ONLY, NO_SECRETS_IN_CONTEXT).
A grant says which principal, or which run, may use which connection; the runner
uses grant ∩ request (GRANT_INTERSECTION_REQUIRED).
"""

from __future__ import annotations

import re
import uuid
from typing import Any

from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Q
from django.utils import timezone

from apps.connections import crypto
from apps.connections.scrubbing import MIN_SECRET_LENGTH
from apps.tenants.epoch import EpochQuerySet
from apps.tenants.models import Tenant, validate_principal

HOST_PATTERN_RE = re.compile(r"^(\*\.)?([A-Za-z0-9-]+\.)*[A-Za-z0-9-]+$|^\[[0-9a-fA-F:]+\]$")
SECRET_FIELDS: dict[str, tuple[str, ...]] = {
    "api_key": ("header_name", "value"),
    "bearer": ("token",),
    "basic": ("username", "password"),
    "oauth": ("access_token", "refresh_token"),
}
# The fields that are secret by themselves (a header name or a user name is not).
SECRET_VALUE_FIELDS = frozenset({"value", "token", "password", "access_token", "refresh_token"})


def validate_host_pattern(value: Any) -> None:
    if not isinstance(value, list) or not all(isinstance(h, str) and h for h in value):
        raise ValidationError('Allowed hosts is a list of host names, e.g. ["api.github.com"].')
    for host in value:
        if not HOST_PATTERN_RE.match(host):
            raise ValidationError(f"{host!r} is not a host name (no scheme, path or port).")


class Connection(models.Model):
    class Kind(models.TextChoices):
        API_KEY = "api_key", "API key (in a header)"
        BEARER = "bearer", "bearer token"
        BASIC = "basic", "basic auth"
        OAUTH = "oauth", "OAuth access/refresh pair"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # db_index=False: unique_connection_name leads with it (tests/test_indexes.py).
    tenant = models.ForeignKey(
        Tenant, on_delete=models.CASCADE, related_name="connections", db_index=False
    )
    name = models.CharField(max_length=200)
    kind = models.CharField(max_length=16, choices=Kind.choices)
    secret_encrypted = models.TextField(editable=False, default="")
    allowed_hosts = models.JSONField(
        default=list,
        validators=[validate_host_pattern],
        help_text='Hosts the credential may be sent to, e.g. ["api.example.com", "*.example.org"].',
    )
    allow_private_network = models.BooleanField(
        default=False,
        help_text="Allow private and loopback addresses (never link-local or cloud metadata). "
        "Only a superuser may set it: egress into the host's networks is the host "
        "operator's decision, not a tenant's.",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    # A bulk update (of its tenant, say) changes the epoch, as a save or a delete does.
    objects = EpochQuerySet["Connection"].as_manager()

    class Meta:
        ordering = ["tenant__slug", "name"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "name"], name="unique_connection_name")
        ]
        permissions = [("use_connection", "Can use this connection in tool calls")]

    def __str__(self) -> str:
        return f"{self.tenant.slug}/{self.name}"

    def set_secret(self, **fields: str) -> None:
        expected = SECRET_FIELDS[self.kind]
        required = ("access_token",) if self.kind == self.Kind.OAUTH else expected
        missing = [name for name in required if not fields.get(name)]
        if missing:
            raise ValidationError(f"A {self.get_kind_display()} needs {', '.join(missing)}.")
        # A shorter secret could not be scrubbed from tool output (scrubbing.py).
        short = [
            name
            for name in expected
            if name in SECRET_VALUE_FIELDS and 0 < len(fields.get(name) or "") < MIN_SECRET_LENGTH
        ]
        if short:
            raise ValidationError(
                f"{', '.join(short)} must be at least {MIN_SECRET_LENGTH} characters long."
            )
        self.secret_encrypted = crypto.encrypt({k: fields[k] for k in expected if fields.get(k)})

    def read_secret(self) -> dict[str, str]:
        """For tests and scripts; a call's credentials come from `broker.unseal`
        (http_request and the MCP source), which decrypts once per ciphertext."""
        return crypto.decrypt(self.secret_encrypted) if self.secret_encrypted else {}

    @property
    def has_secret(self) -> bool:
        return bool(self.secret_encrypted)


class GrantQuerySet(EpochQuerySet["Grant"]):
    """Bulk updates (revoking many, moving an expiry) change the authorization epoch, as
    saves and deletes do: the call path caches grants under it (grants.py)."""

    def active(self) -> GrantQuerySet:
        now = timezone.now()
        return self.filter(revoked_at__isnull=True).filter(
            Q(expires_at__isnull=True) | Q(expires_at__gt=now)
        )

    def usable_by(self, tenant: Tenant, principal: str, run_id: str) -> GrantQuerySet:
        """Grants that let this principal, or this run, use a connection now."""
        return (
            self.active()
            .filter(tenant=tenant)
            .filter(Q(principal=principal) | Q(principal="", run_id=run_id))
            .filter(Q(run_id="") | Q(run_id=run_id))
        )


class Grant(models.Model):
    """Lets a principal (optionally within one run only), or anyone in a run, use a connection."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="grants")
    connection = models.ForeignKey(Connection, on_delete=models.CASCADE, related_name="grants")
    principal = models.CharField(
        max_length=160,
        blank=True,
        help_text="e.g. agent:support-bot; blank with a run id: anyone in that run.",
    )
    run_id = models.CharField(max_length=128, blank=True, help_text="Limit the grant to one run.")
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = GrantQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        who = self.principal or "anyone"
        scope = f" in run {self.run_id}" if self.run_id else ""
        return f"{who} may use {self.connection}{scope}"

    def clean(self) -> None:
        if not self.principal and not self.run_id:
            raise ValidationError("A grant names a principal, a run, or both.")
        if self.principal:
            validate_principal(self.principal)
        if self.connection_id and self.tenant_id and self.connection.tenant_id != self.tenant_id:
            raise ValidationError("The connection belongs to another tenant.")

    def revoke(self) -> None:
        self.revoked_at = timezone.now()
        self.save(update_fields=["revoked_at"])
