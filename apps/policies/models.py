"""Policies: which tools a tenant may use, as data edited in the admin (POLICY_IS_DATA)."""

from __future__ import annotations

from django.db import models

from apps.tenants.models import Tenant
from apps.tools.models import Tool


class PolicyQuerySet(models.QuerySet["Policy"]):
    def in_force(self, tenant: Tenant) -> PolicyQuerySet:
        return self.filter(tenant=tenant, enabled=True)


class Policy(models.Model):
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="policies")
    name = models.CharField(max_length=200)
    description = models.TextField(blank=True)
    enabled = models.BooleanField(default=True)
    tools = models.ManyToManyField(
        Tool,
        blank=True,
        related_name="policies",
        help_text="Explicit allowlist. A disabled tool stays refused even when listed here.",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = PolicyQuerySet.as_manager()

    class Meta:
        verbose_name_plural = "policies"
        ordering = ["tenant__slug", "name"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "name"], name="unique_policy_name")
        ]

    def __str__(self) -> str:
        return f"{self.tenant.slug}/{self.name}"
