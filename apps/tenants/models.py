"""Tenants, their staff members, and the API keys agents authenticate with."""

from __future__ import annotations

import hashlib
import re
import secrets

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator
from django.db import models, transaction
from django.db.models import Q
from django.dispatch import Signal
from django.utils import timezone

from apps.tenants import epoch

PRINCIPAL_RE = re.compile(r"^[a-z][a-z0-9_-]{0,31}:[A-Za-z0-9._@+-]{1,120}$")
KEY_PREFIX = "th_"

# Sent (with `key=`) once a key's revocation is committed: its open streams end
# (apps/invocations/revocations.py). A signal, so tenants need not know about streams.
key_revoked = Signal()


def validate_principal(value: str) -> None:
    if not PRINCIPAL_RE.fullmatch(value):  # fullmatch: `$` alone also accepts a trailing newline
        raise ValidationError(
            "A principal looks like 'kind:name', e.g. 'agent:support-bot' "
            "(lowercase kind, then letters, digits, . _ @ + -)."
        )


class Tenant(models.Model):
    slug = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=200, blank=True)
    members = models.ManyToManyField(
        settings.AUTH_USER_MODEL,
        blank=True,
        through="Membership",
        related_name="tenants",
        help_text="Staff users of this tenant; each membership names their role here.",
    )
    max_concurrent_calls = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="Calls of this tenant that may run at once, all tools and processes "
        "together (a call that timed out counts until its thread ends). Blank: no limit.",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    objects = epoch.EpochQuerySet["Tenant"].as_manager()

    class Meta:
        ordering = ["slug"]
        constraints = [
            models.CheckConstraint(
                condition=Q(max_concurrent_calls__isnull=True) | Q(max_concurrent_calls__gte=1),
                name="tenant_max_concurrent_calls_at_least_1",
                violation_error_message="A concurrency limit is at least 1 (blank: no limit).",
            )
        ]

    def __str__(self) -> str:
        return self.slug


class Role(models.TextChoices):
    """A staff member's role in one tenant; what each may do is `apps.tenants.roles`."""

    OPERATOR = "operator", "operator"
    ADMIN = "admin", "tenant admin"
    MEMBER = "member", "member (console runs and streams only)"


class Membership(models.Model):
    """A staff user's role in one tenant. Permission checks on a tenant's rows ask this
    role (apps.tenants.backends), never a global permission."""

    # db_index=False: the (tenant, user) unique constraint leads with it (tests/test_indexes.py).
    tenant = models.ForeignKey(
        Tenant, on_delete=models.CASCADE, related_name="memberships", db_index=False
    )
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships"
    )
    # `tenant.members.add(user)` makes a plain member: the least a role can be.
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)

    objects = epoch.EpochQuerySet["Membership"].as_manager()

    class Meta:
        # The table Tenant.members had before it named a role (migration 0004).
        db_table = "tenants_tenant_members"
        unique_together = [("tenant", "user")]

    def __str__(self) -> str:
        return f"{self.user} in {self.tenant}: {self.role}"


def _hash_key(raw: str) -> str:
    # Keys carry 256 bits of randomness, so a fast hash is enough: there is
    # nothing to brute-force that a slow hash would protect.
    return hashlib.sha256(raw.encode()).hexdigest()


class ApiKeyQuerySet(epoch.EpochQuerySet["ApiKey"]):
    def active(self) -> ApiKeyQuerySet:
        return self.filter(revoked_at__isnull=True)


class ApiKeyManager(models.Manager["ApiKey"]):
    def get_queryset(self) -> ApiKeyQuerySet:
        return ApiKeyQuerySet(self.model, using=self._db)

    def issue(self, tenant: Tenant, principal: str, name: str = "") -> tuple[ApiKey, str]:
        """Create a key and return it with its plaintext, which is never stored."""
        validate_principal(principal)
        key = self.model(tenant=tenant, principal=principal, name=name)
        key.bind_service_user()
        raw = key.assign_new_secret()
        key.save()
        return key, raw

    def for_raw_key(self, raw: str) -> ApiKey | None:
        """The active key matching a presented plaintext, or None."""
        if not raw.startswith(KEY_PREFIX) or raw.count("_") < 2 or len(raw) > 200:
            return None
        prefix = raw[len(KEY_PREFIX) :].split("_", 1)[0]
        candidate = _KEYS.get(prefix, lambda: self._active_with_prefix(prefix))
        if candidate is None or not secrets.compare_digest(candidate.key_hash, _hash_key(raw)):
            return None
        return candidate

    def _active_with_prefix(self, prefix: str) -> ApiKey | None:
        return (
            self.get_queryset()
            .active()
            .select_related("tenant", "user")
            .filter(prefix=prefix)
            .first()
        )


# Keys by prefix, as of the authorization epoch: revoking or editing a key (or its
# tenant or user) changes the epoch, so it holds on the next request (issue 13).
_KEYS = epoch.EpochCache("api keys")


class ApiKey(models.Model):
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="api_keys")
    principal = models.CharField(
        max_length=160,
        validators=[validate_principal],
        help_text="Who calls with this key, e.g. agent:support-bot.",
    )
    name = models.CharField(max_length=200, blank=True)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.PROTECT,
        editable=False,
        related_name="api_keys",
        help_text="The principal's service user, which object permissions are granted to.",
    )
    prefix = models.CharField(max_length=16, unique=True, editable=False)
    key_hash = models.CharField(max_length=64, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)
    revoked_at = models.DateTimeField(null=True, blank=True)

    objects = ApiKeyManager()

    class Meta:
        ordering = ["-created_at"]
        verbose_name = "API key"

    def __str__(self) -> str:
        return (
            f"{KEY_PREFIX}{self.prefix}… ({self.principal} @ {self.tenant_id and self.tenant.slug})"
        )

    @property
    def display_prefix(self) -> str:
        return f"{KEY_PREFIX}{self.prefix}_…"

    def clean(self) -> None:
        """A new key's principal must map to its own service user (principals.py)."""
        if self.pk is not None or not self.tenant_id or not PRINCIPAL_RE.fullmatch(self.principal):
            return
        from apps.tenants.principals import UnmappablePrincipal, existing_service_user

        try:
            existing_service_user(self.tenant, self.principal)
        except UnmappablePrincipal as exc:
            raise ValidationError({"principal": exc.messages}) from None

    def bind_service_user(self) -> None:
        from apps.tenants.principals import service_user

        self.user = service_user(self.tenant, self.principal)

    def assign_new_secret(self) -> str:
        """Give an unsaved key its secret; returns the plaintext, which is not kept."""
        self.prefix = secrets.token_hex(4)
        raw = f"{KEY_PREFIX}{self.prefix}_{secrets.token_urlsafe(32)}"
        self.key_hash = _hash_key(raw)
        return raw

    def touch(self) -> None:
        """Record use, at most once a minute, to avoid a write per request."""
        now = timezone.now()
        if self.last_used_at is None or (now - self.last_used_at).total_seconds() > 60:
            ApiKey.objects.filter(pk=self.pk).update(last_used_at=now)
            self.last_used_at = now

    def revoke(self) -> None:
        self.revoked_at = timezone.now()
        self.save(update_fields=["revoked_at"])
        transaction.on_commit(lambda: key_revoked.send(sender=ApiKey, key=self))


class AuthzEpoch(models.Model):
    """The number every edit to who-may-do-what changes, so that each process may cache
    the answers until it does (row 1), and the tools epoch, which only a tool's row
    written changes (row 2; apps/tenants/epoch.py)."""

    value = models.BigIntegerField()

    class Meta:
        verbose_name = "authorization epoch"

    def __str__(self) -> str:
        return f"authorization epoch {self.value}"


class EpochChange(models.Model):
    """What one write changed under the tools or policies epoch (apps/tenants/epoch.py):
    the epoch's value it gave and the ids of the rows it wrote (tool ids, policy ids), or
    null where they are not known. A process that kept rows at one value reads the
    changes since then and reloads only those rows. Written in the edit's transaction,
    after the epoch row's update, so while that row's lock is held: ids ascend in the
    order the values were given. Only the last few hundred per row are kept."""

    id = models.BigAutoField(primary_key=True)
    row = models.PositiveSmallIntegerField()
    value = models.BigIntegerField()
    keys = models.JSONField(null=True)

    class Meta:
        verbose_name = "epoch change"
        indexes = [models.Index(fields=["row", "value"], name="epochchange_value_idx")]

    def __str__(self) -> str:
        return f"epoch {self.row} change to {self.value}"
