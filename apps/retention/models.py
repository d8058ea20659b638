"""How long a tenant's audit trail is kept, and what pruning removed.

A record, its run events and its approval (with votes) are one audit entry: they are
kept for one number of days and leave together, in one export line. Separate numbers
would split an entry across passes (the approval's foreign key cascades from the record
anyway), and the export could no longer write a record with its events.

What pruning removed stays answerable: a `PruneMark` per pass and tenant (before what
instant, when, how many), a `PrunedId` per record and approval id (a 410 names the
pass), a `PrunedRun` per run (up to which seq its events are gone, so a replay from
an older seq is a 410, not a silent gap).
"""

from __future__ import annotations

import uuid
from datetime import datetime

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models

from apps.tenants.models import Tenant

REFUSED_DAYS = (
    "Retention is a whole number of days, at least 1 (0 or less would delete every "
    "finished call at once). Leave it empty for the deployment default "
    "(TOOLHUB_RETENTION_DAYS; unset keeps everything)."
)


def validate_days(value: int | None) -> None:
    if value is not None and value < 1:
        raise ValidationError(REFUSED_DAYS, code="retention_days")


class RetentionPolicyQuerySet(models.QuerySet["RetentionPolicy"]):
    def days_for(self, tenant: Tenant) -> int | None:
        """The tenant's days, else the deployment default; None keeps everything."""
        days = self.filter(tenant=tenant).values_list("days", flat=True).first()
        return days if days is not None else settings.TOOLHUB_RETENTION_DAYS


class RetentionPolicy(models.Model):
    """A tenant's retention: finished calls older than `days` are pruned."""

    tenant = models.OneToOneField(
        Tenant, on_delete=models.CASCADE, primary_key=True, related_name="retention"
    )
    days = models.IntegerField(
        null=True,
        blank=True,
        validators=[validate_days],
        help_text=(
            "Days a finished call (record, run events, approval) is kept. Empty: the "
            "deployment default (TOOLHUB_RETENTION_DAYS)."
        ),
    )
    updated_at = models.DateTimeField(auto_now=True)

    objects = RetentionPolicyQuerySet.as_manager()

    class Meta:
        verbose_name_plural = "retention policies"
        constraints = [
            models.CheckConstraint(
                condition=models.Q(days__isnull=True) | models.Q(days__gte=1),
                name="retention_days_at_least_one",
            )
        ]

    def __str__(self) -> str:
        return f"{self.tenant}: {self.days or 'default'}"


class PruneMark(models.Model):
    """One pruning pass over one tenant: calls created before `before` were removed."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    before = models.DateTimeField()
    pruned_at = models.DateTimeField()
    records = models.PositiveIntegerField(default=0)
    events = models.PositiveIntegerField(default=0)
    approvals = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["-pruned_at"]

    def __str__(self) -> str:
        return f"{self.tenant}: before {self.before:%Y-%m-%d}, on {self.pruned_at:%Y-%m-%d}"

    def describe(self, what: str = "records") -> str:
        return f"pruned on {_day(self.pruned_at)}: {what} created before {_day(self.before)}"

    def as_gone(self, what: str = "records") -> dict[str, str]:
        """The body of a 410 for something this pass removed."""
        return {
            "detail": f"Gone: {self.describe(what)} (retention).",
            "prunedAt": _instant(self.pruned_at),
            "prunedBefore": _instant(self.before),
        }


class PrunedId(models.Model):
    """A pruned record's or approval's id (a tombstone): its links answer 410."""

    class Kind(models.TextChoices):
        RECORD = "record"
        APPROVAL = "approval"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    kind = models.CharField(max_length=8, choices=Kind.choices)
    mark = models.ForeignKey(PruneMark, on_delete=models.CASCADE, related_name="+")

    def __str__(self) -> str:
        return f"{self.kind} {self.id}"


class PrunedRun(models.Model):
    """A run whose events up to `through_seq` were pruned."""

    # db_index=False: one_pruned_run leads with it.
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+", db_index=False)
    run_id = models.CharField(max_length=128)
    through_seq = models.PositiveBigIntegerField()
    mark = models.ForeignKey(PruneMark, on_delete=models.CASCADE, related_name="+")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant", "run_id"], name="one_pruned_run")]

    def __str__(self) -> str:
        return f"{self.run_id} through #{self.through_seq}"


def _day(value: datetime) -> str:
    return value.strftime("%Y-%m-%d %H:%M UTC")


def _instant(value: datetime) -> str:
    return value.isoformat().replace("+00:00", "Z")
