"""Policies as data (POLICY_IS_DATA), edited in the admin.

A policy applies to a tenant's callers, optionally only to a group or to one
principal. It allows tools (explicitly or by id pattern), says which effects
need a human, sets budgets, and carries rules: CEL conditions over the call's
arguments with an outcome. The evaluator lives in apps/policies/policy.py.
"""

from __future__ import annotations

import fnmatch
import re

from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from apps.policies import conditions
from apps.tenants import epoch
from apps.tenants.epoch import RowBumpingQuerySet
from apps.tenants.models import Tenant, validate_principal
from apps.tenants.scoping import belongs_to, tenant_group_name
from apps.tools.models import Effect, Tool

PATTERN_RE = re.compile(r"^[a-z0-9_*?-]{1,140}$")


def validate_patterns(value: str) -> None:
    for line in value.splitlines():
        pattern = line.strip()
        if pattern and not PATTERN_RE.match(pattern):
            raise ValidationError(
                f"{pattern!r} is not a tool id pattern (lowercase id characters, * and ?)."
            )


def validate_effects(value: object) -> None:
    if not isinstance(value, list) or any(effect not in Effect.values for effect in value):
        raise ValidationError(f"Approval effects must be a list of {', '.join(Effect.values)}.")


class Outcome(models.TextChoices):
    ALLOW = "allow"
    REQUIRE_APPROVAL = "require_approval", "require approval"
    DENY = "deny"


class PolicyQuerySet(RowBumpingQuerySet["Policy"]):
    """Bulk updates (the admin's enable and disable actions) change the authorization epoch
    and the policies epoch."""

    bumps = epoch.POLICIES_ROW

    def in_force(self, tenant: Tenant) -> PolicyQuerySet:
        return self.filter(tenant=tenant, enabled=True)


class Policy(models.Model):
    # db_index=False: unique_policy_name leads with it (tests/test_indexes.py).
    tenant = models.ForeignKey(
        Tenant, on_delete=models.CASCADE, related_name="policies", db_index=False
    )
    name = models.CharField(max_length=200)
    description = models.TextField(blank=True)
    enabled = models.BooleanField(default=True)
    group = models.ForeignKey(
        Group,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        help_text="Apply only to callers in this group (blank: the whole tenant).",
    )
    principal = models.CharField(
        max_length=160,
        blank=True,
        validators=[validate_principal],
        help_text="Apply only to this principal, e.g. agent:support-bot (blank: any).",
    )
    tools = models.ManyToManyField(
        Tool,
        blank=True,
        related_name="policies",
        help_text="Explicit allowlist. A disabled tool stays refused even when listed here.",
    )
    tool_patterns = models.TextField(
        blank=True,
        validators=[validate_patterns],
        help_text="One id pattern per line, e.g. mcp__github__*. Matches enabled tools only.",
    )
    approval_effects = models.JSONField(
        default=list,
        blank=True,
        validators=[validate_effects],
        help_text='Effects whose calls wait for a human, e.g. ["external_side_effect"].',
    )
    max_runtime_ms = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Budget: a call runs at most this long (caps the tool's timeout).",
    )
    max_result_bytes = models.PositiveIntegerField(
        null=True, blank=True, help_text="Budget: a larger result fails with result_too_large."
    )
    calls_per_minute = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Budget: calls per minute per principal (rate_limited beyond).",
    )
    approval_timeout_minutes = models.PositiveIntegerField(
        default=15,
        validators=[MinValueValidator(1), MaxValueValidator(7 * 24 * 60)],
        help_text="A held call not decided in time expires and never runs.",
    )
    four_eyes = models.BooleanField(
        default=False, help_text="Nobody may approve a call made under their own principal."
    )
    high_consequence_quorum = models.PositiveSmallIntegerField(
        default=1,
        validators=[MinValueValidator(1), MaxValueValidator(5)],
        help_text="Approvals needed for calls of high-consequence tools.",
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

    def clean(self) -> None:
        super().clean()
        if self.group_id is None or self.tenant_id is None:
            return
        group, tenant = self.group, self.tenant
        if group is not None and tenant is not None and not belongs_to(group, tenant):
            raise ValidationError(
                {
                    "group": f"{group.name!r} is not a group of tenant {tenant.slug!r}: "
                    f"pick one whose name starts with {tenant_group_name(tenant, '')!r}."
                }
            )

    @property
    def patterns(self) -> list[str]:
        return [line.strip() for line in self.tool_patterns.splitlines() if line.strip()]

    def lists(self, tool: Tool, explicit_ids: set[str]) -> bool:
        """Whether this policy's allowlist names the tool (explicitly or by pattern)."""
        return tool.pk in explicit_ids or any(
            fnmatch.fnmatchcase(tool.pk, p) for p in self.patterns
        )

    @property
    def label(self) -> str:
        return f"policy:{self.pk}:{self.name}"


class RuleQuerySet(RowBumpingQuerySet["PolicyRule"]):
    bumps = epoch.POLICIES_ROW
    change_key = "policy_id"


class PolicyRule(models.Model):
    """A CEL condition over a call; when it holds for a matching tool, its outcome counts.

    The expression sees `args` (the validated arguments), `tool` (id, effect,
    consequenceLevel), `principal` and `runId`, and must return a boolean.
    """

    policy = models.ForeignKey(Policy, on_delete=models.CASCADE, related_name="rules")
    position = models.PositiveIntegerField(default=0)
    tool_pattern = models.CharField(
        max_length=140,
        default="*",
        help_text="Tool id pattern the rule applies to (e.g. core__http_request).",
    )
    condition = models.TextField(
        help_text='CEL, e.g. args.amount > 100 or !args.url.startsWith("https://api.example.com/")'
    )
    outcome = models.CharField(max_length=20, choices=Outcome.choices)
    description = models.CharField(max_length=300, blank=True)

    objects = RuleQuerySet.as_manager()

    class Meta:
        ordering = ["policy", "position", "pk"]

    def __str__(self) -> str:
        return f"{self.outcome} {self.tool_pattern} when {self.condition[:60]}"

    def clean(self) -> None:
        validate_patterns(self.tool_pattern)
        try:
            conditions.compile_condition(self.condition)
        except conditions.ConditionError as exc:
            raise ValidationError({"condition": str(exc)}) from None

    def matches(self, tool: Tool) -> bool:
        return fnmatch.fnmatchcase(tool.pk, self.tool_pattern)

    @property
    def label(self) -> str:
        return f"{self.policy.label}/rule:{self.pk}"

    @property
    def name(self) -> str:
        """How denials name the rule: its description, else its condition, and its id."""
        what = self.description or f"when {self.condition[:160]}"
        return f"Rule {self.pk} of policy {self.policy.name!r} ({what})"
