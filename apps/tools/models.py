"""The tool catalog as data: one row per tool, enabled or not by staff."""

from __future__ import annotations

import logging
from typing import Any

from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator
from django.db import models, transaction
from django.db.models import Q
from django.utils import timezone

from apps.tenants import epoch
from apps.tenants.epoch import EpochCache, EpochQuerySet
from apps.tools import call_settings
from apps.tools.contracts import (
    DEFAULT_KEY_TTL_S,
    Idempotency,
    Retries,
    default_idempotency,
    default_retries,
)
from apps.tools.registry import RegisteredTool, ToolRegistrationError, ToolRegistry

logger = logging.getLogger(__name__)


class Effect(models.TextChoices):
    READ_ONLY = "read_only", "read only"
    STATE_CHANGE = "state_change", "state change"
    EXTERNAL_SIDE_EFFECT = "external_side_effect", "external side effect"


class ConsequenceLevel(models.TextChoices):
    LOW = "low"
    MEDIUM = "medium"
    HIGH = "high"


class CacheScope(models.TextChoices):
    """Who shares a cached result (apps/invocations/result_cache.py)."""

    TENANT = "tenant", "every caller of the tenant"
    PRINCIPAL = "principal", "the same principal"
    RUN = "run", "the same run"


class Strategy(models.TextChoices):
    CUSTOM = "custom", "custom: the caller's idempotencyKey"
    AUTO = "auto", "auto: from the tool, its arguments and connection"
    PARAMS = "params", "params: from the named arguments"
    NONE = "none", "none: never deduplicated"


class KeyScope(models.TextChoices):
    TENANT = "tenant"
    PRINCIPAL = "principal"
    RUN = "run", "principal and run"


class Source(models.TextChoices):
    CORE = "core", "built in"
    MCP = "mcp", "MCP server"


_TOOLS = EpochCache("tools")


class ToolQuerySet(EpochQuerySet["Tool"]):
    """Bulk updates (enable, disable, mark gone) change the authorization epoch, and the
    tools epoch, and stamp `updated_at` as a save does: the catalog keeps each tool's row
    and encoding per process by it (apps/tools/rows.py)."""

    def update(self, **kwargs: Any) -> int:
        kwargs.setdefault("updated_at", timezone.now())
        with transaction.atomic(using=self.db):
            # The ids written, for the tools epoch's log (epoch.MAX_KEYS + 1: too many).
            keys = list(self.values_list("pk", flat=True)[: epoch.MAX_KEYS + 1])
            changed = super().update(**kwargs)
            if changed:
                epoch.bump_tools(keys)
        return changed

    def bulk_create(self, objs: Any, *args: Any, **kwargs: Any) -> list[Tool]:
        with transaction.atomic(using=self.db):
            made = super().bulk_create(objs, *args, **kwargs)
            if made:
                epoch.bump_tools([obj.pk for obj in made])
        return made

    def bulk_update(self, objs: Any, fields: Any, *args: Any, **kwargs: Any) -> int:
        objs, now = list(objs), timezone.now()
        for obj in objs:
            obj.updated_at = now
        fields = [*fields, "updated_at"] if "updated_at" not in fields else fields
        with transaction.atomic(using=self.db):
            changed = super().bulk_update(objs, fields, *args, **kwargs)
            if changed:
                epoch.bump_tools([obj.pk for obj in objs])
        return changed

    def usable(self) -> ToolQuerySet:
        """Tools a policy may hand out: enabled by staff and still provided."""
        return self.filter(enabled=True, available=True)


class ToolManager(models.Manager["Tool"]):
    def get_queryset(self) -> ToolQuerySet:
        return ToolQuerySet(self.model, using=self._db)

    def usable(self) -> ToolQuerySet:
        return self.get_queryset().usable()

    def current(self, tool_id: str) -> Tool | None:
        """The tool's row as of the authorization epoch (cached per process; any edit
        of a tool changes the epoch, so a disabled tool is refused on the next call)."""
        return _TOOLS.get(tool_id, lambda: self.filter(pk=tool_id).first())

    @transaction.atomic
    def sync_registry(self, registry: ToolRegistry) -> list[Tool]:
        """Mirror the in-code contracts into rows; staff's enabled flag is kept.

        A core contract whose id is held by a tool of another source is a
        collision (TOOL_ID_STABILITY): refused, never overwritten.
        """
        registry.check_dependencies()
        synced = []
        for registered in registry.all():
            existing = self.filter(pk=registered.id).first()
            if existing is not None and existing.source != Source.CORE:
                raise ToolRegistrationError(
                    f"tool id collision: {registered.id} already belongs to "
                    f"a {existing.source} tool"
                )
            tool = existing or Tool(id=registered.id, enabled=True)
            tool.apply_contract(registered)
            tool.save()
            synced.append(tool)
        gone = self.filter(source=Source.CORE, available=True).exclude(
            pk__in=[t.pk for t in synced]
        )
        gone.update(available=False)
        return synced


class Tool(models.Model):
    id = models.CharField(primary_key=True, max_length=140)
    name = models.CharField(max_length=64)
    description = models.CharField(max_length=200)
    input_schema = models.JSONField()
    output_schema = models.JSONField(default=dict)
    schema_hash = models.CharField(max_length=16)
    effect = models.CharField(max_length=24, choices=Effect.choices)
    consequence_level = models.CharField(max_length=8, choices=ConsequenceLevel.choices)
    requires_confirmation = models.BooleanField(
        default=False, help_text="Every call waits for a human, whatever the policy says."
    )
    requires_connection = models.BooleanField(default=False)
    timeout_ms = models.PositiveIntegerField(default=15000)
    redaction_result = models.JSONField(default=list, help_text="Result fields kept in records.")
    redaction_args = models.JSONField(default=list, help_text="Argument fields kept in records.")
    tags = models.JSONField(default=list, blank=True)
    depends_on = models.JSONField(
        default=list, blank=True, help_text="Ids of the tools this one calls internally."
    )
    version = models.CharField(max_length=32, default="1")
    source = models.CharField(max_length=8, choices=Source.choices, default=Source.CORE)
    enabled = models.BooleanField(
        default=False, help_text="Disabled tools are refused and never listed, whatever the policy."
    )
    available = models.BooleanField(
        default=True,
        editable=False,
        help_text="False when the code or server no longer provides it.",
    )
    # The result cache (read_only tools only): off unless staff set a TTL. An edit of the
    # tool, a policy or a connection changes the authorization epoch, which every cache
    # key carries, so no answer outlives the rules it was given under.
    cache_ttl_s = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Seconds a successful result is reused for the same arguments and "
        "connection (read-only tools only). Empty: no cache.",
    )
    cache_scope = models.CharField(
        max_length=10,
        choices=CacheScope.choices,
        default=CacheScope.PRINCIPAL,
        help_text="Who shares a cached result.",
    )
    max_concurrency = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="Calls of this tool that may run at once, all tenants and processes "
        "together (a call that timed out counts until its thread ends). Blank: no limit.",
    )
    # The idempotency ledger (apps/invocations/ledger.py) and the runner's retries: the
    # tool's own (its contract, or its effect's defaults) until staff change them.
    idempotency_strategy = models.CharField(
        max_length=8, choices=Strategy.choices, default=Strategy.CUSTOM
    )
    idempotency_params = models.JSONField(
        default=list, blank=True, help_text="Strategy params: the arguments that make the key."
    )
    idempotency_scope = models.CharField(
        max_length=10, choices=KeyScope.choices, default=KeyScope.PRINCIPAL
    )
    idempotency_ttl_s = models.PositiveIntegerField(
        default=DEFAULT_KEY_TTL_S,
        help_text="Seconds a successful call's key is remembered, from its first use.",
    )
    retry_attempts = models.PositiveSmallIntegerField(
        default=0, help_text="Retries of an attempt that ended unavailable or timeout."
    )
    retry_backoff_ms = models.PositiveIntegerField(
        default=200, help_text="The first retry's wait; it doubles for each next one."
    )
    retry_jitter = models.FloatField(default=0.2, help_text="Waits spread by +- this fraction.")
    call_settings_by_staff = models.BooleanField(
        default=False,
        help_text="Staff set the idempotency and retry settings: syncs keep them. Untick "
        "to return to the tool's own on the next sync.",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = ToolManager()

    class Meta:
        ordering = ["id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(max_concurrency__isnull=True) | Q(max_concurrency__gte=1),
                name="tool_max_concurrency_at_least_1",
                violation_error_message="A concurrency limit is at least 1 (blank: no limit).",
            )
        ]
        permissions = [
            ("execute_tool", "Can execute this tool"),
            ("decide_approval", "Can decide approvals of this tool's calls"),
        ]

    def __str__(self) -> str:
        return self.id

    @property
    def usable(self) -> bool:
        return self.enabled and self.available

    def clean(self) -> None:
        if self.cache_ttl_s and self.effect != Effect.READ_ONLY:
            raise ValidationError(
                {"cache_ttl_s": "Only read-only tools can have their results cached."}
            )

    @property
    def idempotency(self) -> Idempotency:
        return Idempotency(
            strategy=self.idempotency_strategy,  # type: ignore[arg-type]
            params=tuple(self.idempotency_params or ()),
            scope=self.idempotency_scope,  # type: ignore[arg-type]
            ttl_s=self.idempotency_ttl_s,
        )

    @property
    def retries(self) -> Retries:
        return Retries(
            attempts=self.retry_attempts,
            backoff_ms=self.retry_backoff_ms,
            jitter=self.retry_jitter,
        )

    def check_call_settings(self) -> None:
        """call_settings.check on this row's settings (raises CallSettingsError)."""
        call_settings.check(self.effect, self.input_schema, self.idempotency, self.retries)

    def apply_call_settings(
        self, idempotency: Idempotency | None = None, retries: Retries | None = None
    ) -> None:
        """The tool's own settings (its effect's defaults where not given), unless staff
        set them and they still fit the tool (its arguments or effect may have changed)."""
        if self.call_settings_by_staff:
            try:
                self.check_call_settings()
                return
            except call_settings.CallSettingsError as exc:
                logger.warning("tool %s: staff's call settings dropped: %s", self.id, exc)
                self.call_settings_by_staff = False
        idempotency = idempotency or default_idempotency(self.effect)  # type: ignore[arg-type]
        retries = retries or default_retries(self.effect)  # type: ignore[arg-type]
        self.idempotency_strategy = idempotency.strategy
        self.idempotency_params = list(idempotency.params)
        self.idempotency_scope = idempotency.scope
        self.idempotency_ttl_s = idempotency.ttl_s
        self.retry_attempts = retries.attempts
        self.retry_backoff_ms = retries.backoff_ms
        self.retry_jitter = retries.jitter

    def apply_contract(self, registered: RegisteredTool) -> None:
        contract = registered.contract
        self.name = contract.name
        self.description = contract.description
        self.input_schema = registered.input_schema
        self.output_schema = registered.output_schema
        self.schema_hash = registered.schema_hash
        self.effect = contract.effect
        self.consequence_level = contract.consequence_level
        self.requires_confirmation = contract.requires_confirmation
        self.requires_connection = contract.requires_connection
        self.timeout_ms = int(contract.timeout_s * 1000)
        assert contract.redaction is not None  # checked at registration
        self.redaction_result = list(contract.redaction.result)
        self.redaction_args = list(contract.redaction.args)
        self.tags = list(contract.tags)
        self.depends_on = list(contract.depends_on)
        self.version = contract.version
        self.source = Source.CORE
        self.available = True
        self.apply_call_settings(contract.idempotency, contract.retries)
