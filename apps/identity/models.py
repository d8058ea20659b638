"""Who a provider's user is here, and which of the provider's groups give which role where.

A `GroupMapping` names a group of the provider's groups claim and the role it gives:
either in one tenant it names (`tenant`), or in the tenant whose slug the group's own
name carries (`{tenant}` in `group`, e.g. `toolhub-{tenant}-admins`). Superusers edit
them in the admin; the sign-in (apps/identity/signin.py) applies them at every sign-in.
"""

from __future__ import annotations

import re

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models

from apps.tenants.models import Role, Tenant

PLACEHOLDER = "{tenant}"


class GroupMapping(models.Model):
    group = models.CharField(
        max_length=255,
        help_text=(
            "A group name exactly as the provider sends it in the groups claim, or a "
            "pattern with {tenant} standing for a tenant's slug (toolhub-{tenant}-admins)."
        ),
    )
    tenant = models.ForeignKey(
        Tenant,
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="group_mappings",
        help_text="The tenant this group gives the role in; empty when the group has {tenant}.",
    )
    role = models.CharField(max_length=16, choices=Role.choices)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["group", "tenant"], name="identity_group_tenant_unique"
            ),
            models.UniqueConstraint(
                fields=["group"],
                condition=models.Q(tenant__isnull=True),
                name="identity_group_pattern_unique",
            ),
        ]
        ordering = ["group"]

    def __str__(self) -> str:
        where = self.tenant.slug if self.tenant else "the tenant in the name"
        return f"{self.group} -> {self.get_role_display()} in {where}"

    @property
    def is_pattern(self) -> bool:
        return PLACEHOLDER in self.group

    def clean(self) -> None:
        if self.group.count(PLACEHOLDER) > 1:
            raise ValidationError({"group": "Use {tenant} at most once."})
        if self.is_pattern and self.tenant_id is not None:
            raise ValidationError(
                {"tenant": "Leave the tenant empty: the group's name carries it ({tenant})."}
            )
        if not self.is_pattern and self.tenant_id is None:
            raise ValidationError(
                {"tenant": "Choose the tenant, or put {tenant} in the group's name."}
            )

    def slug_in(self, group: str) -> str | None:
        """The tenant slug a pattern finds in a group name (None when it does not fit)."""
        before, _, after = self.group.partition(PLACEHOLDER)
        found = re.fullmatch(re.escape(before) + r"(.+?)" + re.escape(after), group)
        return found.group(1) if found else None


class ExternalIdentity(models.Model):
    """The provider's user (issuer, subject) a toolhub user is. Sign-in finds users by this
    pair only, never by a name or an email the provider sends, so a provider account
    named like a local superuser does not become that superuser."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="external_identity"
    )
    issuer = models.CharField(max_length=255)
    subject = models.CharField(max_length=255)
    groups = models.JSONField(default=list, help_text="The groups claim at the last sign-in.")
    signed_in_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["issuer", "subject"], name="identity_issuer_subject_unique"
            )
        ]
        verbose_name_plural = "external identities"

    def __str__(self) -> str:
        return f"{self.subject} at {self.issuer}"
