"""Approval requests: tool calls held for a human, as a state machine in the database.

pending -> approved | rejected | expired | cancelled; approved -> executing ->
succeeded | failed; approved -> cancelled. Every transition happens in a transaction
that locks the row and re-reads the status, so the first decision wins and a second
one (two operators, a double click, API and admin at once) gets AlreadyDecided.

An approval becomes executing only in the transaction that records its call's start,
so an executing approval always has its start recorded. A call cancelled while it
runs ends with its record cancelled and its approval failed. A pending approval
that gets no vote before expires_at is expired, and its call never runs.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import datetime
from functools import cached_property
from typing import Any

from django.conf import settings
from django.db import models
from django.utils import timezone

from apps.invocations.models import InvocationRecord
from apps.tenants.models import Tenant
from apps.tenants.scoping import staff_tenants
from apps.tools.models import Tool


class ApprovalStatus(models.TextChoices):
    PENDING = "pending"
    APPROVED = "approved"
    EXECUTING = "executing"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    REJECTED = "rejected"
    EXPIRED = "expired"
    CANCELLED = "cancelled"


DECIDABLE = {ApprovalStatus.PENDING}
OPEN = {ApprovalStatus.PENDING, ApprovalStatus.APPROVED}


APPROVAL_EVENTS = ("approval_required", "approval_decided")
DECIDE_PERMISSION = "tools.decide_approval"


class ApprovalQuerySet(models.QuerySet["ApprovalRequest"]):
    def pending(self) -> ApprovalQuerySet:
        return self.filter(status=ApprovalStatus.PENDING)

    def overdue(self) -> ApprovalQuerySet:
        return self.pending().filter(expires_at__lte=timezone.now())

    def visible_to(self, user: Any) -> ApprovalQuerySet:
        """Approvals in the tenants a staff user has a role in (all for superusers)."""
        if getattr(user, "is_superuser", False) and getattr(user, "is_active", False):
            return self
        return self.filter(tenant__in=staff_tenants(user).values("pk"))

    def events_since(
        self, tenant_ids: Iterable[int], since: datetime, limit: int = 500
    ) -> list[dict[str, Any]]:
        """`tenant_events_since` without the tenants."""
        return [message for _, message in self.tenant_events_since(tenant_ids, since, limit)]

    def tenant_events_since(
        self, tenant_ids: Iterable[int], since: datetime, limit: int = 500
    ) -> list[tuple[int, dict[str, Any]]]:
        """The approval events (`approval_required`, `approval_decided`) of these tenants
        written at or after `since`, oldest first, as streamed, each with its tenant's id
        (whether a user may decide one depends on their role there): what an operators' stream
        re-reads when its feed may have missed pushes. Found through the requests created
        or decided since (at most `limit`), then their runs' events: two queries on
        indexed columns ((tenant, run_id, seq) for the events), however large the
        tenants' event tables."""
        from apps.invocations.models import RunEvent

        requests = list(
            self.filter(tenant_id__in=list(tenant_ids))
            .filter(models.Q(created_at__gte=since) | models.Q(decided_at__gte=since))
            .order_by("-created_at")
            .values_list("pk", "tenant_id", "run_id", "tool_call_id")[:limit]
        )
        if not requests:
            return []
        tenant_of = {str(pk): tenant_id for pk, tenant_id, _, _ in requests}
        found = (
            RunEvent.objects.filter(
                tenant_id__in={tenant_id for _, tenant_id, _, _ in requests},
                run_id__in={run_id for _, _, run_id, _ in requests},
                tool_call_id__in={tool_call_id for *_, tool_call_id in requests},
                type__in=APPROVAL_EVENTS,
                at__gte=since,
            )
            .order_by("at", "seq")
            .values_list("tenant_id", "message")
        )
        return [
            (tenant_id, message)
            for tenant_id, message in found
            if isinstance(message, dict)
            and tenant_of.get(str(message.get("approvalId"))) == tenant_id
        ]

    def decidable_by(self, user: Any) -> ApprovalQuerySet:
        """What a staff user may decide: every approval of the tenants where their role
        gives `decide_approval` (operator, tenant admin), and in their other tenants those
        of tools they hold decide_approval on as an object permission (guardian).

        Two queries whatever the number of tools or requests.
        """
        from guardian.shortcuts import get_objects_for_user

        if not (getattr(user, "is_staff", False) and getattr(user, "is_active", False)):
            return self.none()
        related = self.select_related("tool", "decided_by", "tenant")
        if getattr(user, "is_superuser", False):
            return related
        by_role = staff_tenants(user, DECIDE_PERMISSION).values("pk")
        tools = get_objects_for_user(user, DECIDE_PERMISSION, klass=Tool, accept_global_perms=False)
        return related.filter(
            models.Q(tenant__in=by_role)
            | models.Q(tenant__in=staff_tenants(user).values("pk"), tool__in=tools.values("pk"))
        )


class ApprovalRequest(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # db_index=False: the (tenant, status, created_at) index leads with it (tests/test_indexes.py).
    tenant = models.ForeignKey(
        Tenant, on_delete=models.CASCADE, related_name="approvals", db_index=False
    )
    invocation = models.OneToOneField(
        InvocationRecord, on_delete=models.CASCADE, related_name="approval"
    )
    # Indexed in Meta: a plain index, without the LIKE one PostgreSQL would add for a text key.
    tool = models.ForeignKey(
        Tool, on_delete=models.PROTECT, related_name="approvals", db_index=False
    )
    status = models.CharField(
        max_length=12, choices=ApprovalStatus.choices, default=ApprovalStatus.PENDING
    )
    principal = models.CharField(max_length=160)
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+"
    )
    run_id = models.CharField(max_length=128)
    tool_call_id = models.CharField(max_length=128)
    connection_id = models.CharField(max_length=64, blank=True)
    # The exact arguments that will run. They are the validated, schema-shaped
    # args (never credentials: those stay behind connection ids).
    args = models.JSONField()
    original_args = models.JSONField()
    args_diff = models.JSONField(default=list, blank=True)
    bound_hash = models.CharField(
        max_length=64, help_text="Hash of tool, args and connection that the approval covers."
    )
    hold_reason = models.CharField(max_length=300)
    policy_rule = models.CharField(max_length=300, blank=True)
    approvals_required = models.PositiveSmallIntegerField(default=1)
    four_eyes = models.BooleanField(default=False)
    expires_at = models.DateTimeField()
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    decision_reason = models.CharField(max_length=1000, blank=True)
    claimed_at = models.DateTimeField(
        null=True, blank=True, help_text="When a worker took the approved call to run it."
    )
    # How many times the approved call was put back in the worker queue because its
    # worker died before its tool ran (tasks.reoffer). Null: never.
    reoffered = models.PositiveSmallIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = ApprovalQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["tenant", "status", "-created_at"]),
            models.Index(fields=["status", "expires_at"]),
            models.Index(fields=["tool"], name="approvals_tool_idx"),
            # Every tenant's requests, newest first: the superuser's admin list.
            models.Index(fields=["-created_at", "-id"], name="approvals_newest_idx"),
            # The admin's search by a run or tool call id, in every tenant.
            models.Index(fields=["run_id"], name="approvals_run_idx"),
            models.Index(fields=["tool_call_id"], name="approvals_tool_call_idx"),
            # The sweeper's approved calls waiting for a worker and calls a worker runs:
            # a few rows each, whatever the history. Partial, so that SQLite's planner,
            # once ANALYZE has run, does not take `status = ...` for a third of the table
            # and scan it (it cannot tell one status from another in its statistics).
            models.Index(
                fields=["decided_at"],
                condition=models.Q(status="approved"),
                name="approvals_approved_idx",
            ),
            # The overview's waiting approvals over its window: those not decided (NULL)
            # and those decided since the window began, not every approval ever made.
            models.Index(fields=["decided_at"], name="approvals_decided_idx"),
            models.Index(
                fields=["claimed_at"],
                condition=models.Q(status="executing"),
                name="approvals_executing_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.tool_id} for {self.principal} ({self.status})"

    @property
    def is_expired(self) -> bool:
        return self.status == ApprovalStatus.PENDING and self.expires_at <= timezone.now()

    @property
    def seconds_left(self) -> int:
        return max(0, int((self.expires_at - timezone.now()).total_seconds()))

    @cached_property
    def approvals_given(self) -> int:
        """Approving votes so far (a decision sets it as it counts them)."""
        return self.votes.filter(decision=Vote.Decision.APPROVE).count()


class Vote(models.Model):
    """One operator's approval toward a quorum (a rejection ends the request at once)."""

    class Decision(models.TextChoices):
        APPROVE = "approve"
        REJECT = "reject"

    approval = models.ForeignKey(
        ApprovalRequest, on_delete=models.CASCADE, related_name="votes", db_index=False
    )
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    decision = models.CharField(max_length=8, choices=Decision.choices)
    bound_hash = models.CharField(max_length=64)
    reason = models.CharField(max_length=1000, blank=True)
    # Set as the vote is made, not as it is written: the decision's receipt signs it first.
    created_at = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        ordering = ["created_at"]
        constraints = [
            models.UniqueConstraint(fields=["approval", "user"], name="one_vote_per_operator")
        ]

    def __str__(self) -> str:
        return f"{self.user} {self.decision}s {self.approval_id}"


class WebhookFormat(models.TextChoices):
    GENERIC = "generic", "generic JSON, signed (HMAC-SHA256 with a timestamp)"
    SLACK = "slack", "Slack (incoming webhook)"
    TEAMS = "teams", "Microsoft Teams (workflow webhook, Adaptive Card)"


class ApprovalWebhook(models.Model):
    """Where a tenant's held calls are announced: a chat channel's incoming webhook or any
    HTTPS receiver. Limited to some policy rules, or every held call of the tenant."""

    # No index of its own: the (tenant, name) unique constraint leads with it.
    tenant = models.ForeignKey(
        Tenant, on_delete=models.CASCADE, related_name="approval_webhooks", db_index=False
    )
    name = models.CharField(max_length=100)
    url = models.URLField(max_length=500, help_text="POSTed once for every new held call.")
    format = models.CharField(
        max_length=10, choices=WebhookFormat.choices, default=WebhookFormat.GENERIC
    )
    secret = models.TextField(
        blank=True,
        editable=False,
        help_text="Encrypted signing secret: X-Toolhub-Signature on every message.",
    )
    rules = models.ManyToManyField(
        "policies.PolicyRule",
        blank=True,
        related_name="approval_webhooks",
        help_text="Only calls held by these rules (none chosen: every held call of the tenant).",
    )
    private_network = models.BooleanField(
        default=False,
        help_text="Let this webhook reach a private or loopback address (never link-local "
        "or cloud metadata). Only a superuser may set it, for the URL it has then.",
    )
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["tenant", "name"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "name"], name="one_webhook_name_per_tenant")
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.get_format_display()})"

    def set_secret(self, secret: str) -> None:
        from apps.connections import crypto

        self.secret = crypto.encrypt({"secret": secret}) if secret else ""

    def signing_secret(self) -> str:
        from apps.connections import crypto

        return str(crypto.decrypt(self.secret)["secret"]) if self.secret else ""


class DeliveryStatus(models.TextChoices):
    PENDING = "pending"  # the next attempt is queued
    DELIVERED = "delivered"
    FAILED = "failed"  # every attempt failed
    DROPPED = "dropped"  # not sent any more: the webhook was deleted or disabled


class WebhookDelivery(models.Model):
    """One held call announced to one webhook, with every attempt's outcome: what an
    operator reads when someone asks "why did the channel not hear about it?"."""

    # No index of its own: the (approval, webhook) unique constraint leads with it.
    approval = models.ForeignKey(
        ApprovalRequest, on_delete=models.CASCADE, related_name="webhook_deliveries", db_index=False
    )
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+", db_index=False)
    webhook = models.ForeignKey(
        ApprovalWebhook, null=True, on_delete=models.SET_NULL, related_name="deliveries"
    )
    url = models.URLField(max_length=500, help_text="Where it was sent (as of the first attempt).")
    format = models.CharField(max_length=10, choices=WebhookFormat.choices)
    status = models.CharField(
        max_length=10, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING
    )
    attempts = models.PositiveSmallIntegerField(default=0)
    last_status = models.PositiveSmallIntegerField(
        null=True, blank=True, help_text="The receiver's HTTP status at the last attempt."
    )
    last_error = models.CharField(max_length=300, blank=True)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        verbose_name_plural = "webhook deliveries"
        indexes = [models.Index(fields=["tenant", "-created_at"], name="delivery_tenant_idx")]
        constraints = [
            models.UniqueConstraint(fields=["approval", "webhook"], name="one_delivery_per_hook")
        ]

    def __str__(self) -> str:
        return f"{self.approval_id} -> {self.url} ({self.status})"
