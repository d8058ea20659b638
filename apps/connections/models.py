"""Connections: tenant-owned external credentials, referenced by opaque id only.

Tools never see a credential; they get the connection's id in their context
(CONNECTION_ID_ONLY), and the runner checks the id belongs to the caller's tenant
before anything else happens with it.
"""

from __future__ import annotations

import uuid

from django.db import models

from apps.tenants.models import Tenant


class Connection(models.Model):
    class Kind(models.TextChoices):
        API_KEY = "api_key", "API key"
        BEARER = "bearer", "bearer token"
        BASIC = "basic", "basic auth"
        OAUTH = "oauth", "OAuth access/refresh pair"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="connections")
    name = models.CharField(max_length=200)
    kind = models.CharField(max_length=16, choices=Kind.choices)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["tenant__slug", "name"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "name"], name="unique_connection_name")
        ]

    def __str__(self) -> str:
        return f"{self.tenant.slug}/{self.name}"
