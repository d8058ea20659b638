from __future__ import annotations

import json
from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import Q, QuerySet
from django.http import HttpRequest
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils.html import format_html, format_html_join

from apps.audit import verify
from apps.invocations import ledger, links
from apps.invocations.models import InvocationRecord, RunEvent
from apps.tenants.admin import TenantScopedAdmin, tenants_holding
from apps.tenants.roles import may


def _pretty(value: Any) -> str:
    return format_html(
        '<pre class="toolhub-json">{}</pre>', json.dumps(value, indent=2, ensure_ascii=False)
    )


def _link_list(items: list[links.Link]) -> str:
    if not items:
        return "—"
    return format_html_join(" · ", '<a href="{}">{}</a>', ((i.url, i.text) for i in items))


@admin.register(InvocationRecord)
class InvocationRecordAdmin(TenantScopedAdmin):
    """Records are evidence: readable, never editable.

    Searchable by invocation id (exact), tool call id and run id; each record links to
    its run's timeline and events, its approval, its policy and its connection.
    """

    lean_list = True  # its columns read no JSON
    list_display = (
        "created_at",
        "tool_ref",
        "principal",
        "tenant",
        "status",
        "error_code",
        "duration_ms",
        "run_link",
    )
    # No filter that lists the column's values (tool_ref) and no date_hierarchy: both read
    # every row to build their choices. created_at's filter offers fixed ranges.
    list_filter = ("tenant", "status", "error_code", "created_at")
    search_fields = ("=id", "=tool_call_id", "=run_id")
    exact_search_only = True
    searched_per_tenant = ("tool_call_id", "run_id")  # (tenant, …) indexes
    search_help_text = "An invocation id, tool call id or run id (whole ids only)."
    fieldsets = (
        (None, {"fields": ("id", "tenant", "tool_ref", "principal", "status", "ok", "related")}),
        (
            "Call",
            {
                "fields": (
                    "tool_call_id",
                    "run_id",
                    "connection_id",
                    "idempotency_key",
                    "traceparent",
                )
            },
        ),
        (
            "Arguments and result",
            {"fields": ("args_json", "result_json", "error_code", "safe_message")},
        ),
        ("Decision", {"fields": ("policy_rule",)}),
        (
            "Times",
            {"fields": ("created_at", "started_at", "ended_at", "duration_ms", "retry_after_ms")},
        ),
        ("Audit", {"fields": ("receipt_view", "audit_chain")}),
    )
    readonly_fields = ("related", "args_json", "result_json", "receipt_view", "audit_chain")
    actions = ("forget_keys", "forget_principals_keys", "forget_tools_keys")

    def get_queryset(self, request: HttpRequest) -> Any:
        return super().get_queryset(request).select_related("tenant")

    # Invalidation (apps/invocations/ledger.py): by key, principal or tool, in the record's
    # tenant, for whoever may change that tenant's API keys (tenant admins, superusers).
    # A call still running keeps its key until it ends.

    @admin.action(description="Forget the idempotency keys of the selected calls")
    def forget_keys(self, request: HttpRequest, queryset: QuerySet[InvocationRecord]) -> None:
        self._forget(request, queryset, lambda r: {"key": r.idempotency_key or ""}, keyed=True)

    @admin.action(description="Forget every idempotency key of the selected calls' principals")
    def forget_principals_keys(
        self, request: HttpRequest, queryset: QuerySet[InvocationRecord]
    ) -> None:
        self._forget(request, queryset, lambda r: {"principal": r.principal})

    @admin.action(description="Forget every idempotency key of the selected calls' tools")
    def forget_tools_keys(self, request: HttpRequest, queryset: QuerySet[InvocationRecord]) -> None:
        self._forget(request, queryset, lambda r: {"tool_ref": r.tool_ref})

    def _forget(
        self,
        request: HttpRequest,
        queryset: QuerySet[InvocationRecord],
        which: Any,
        *,
        keyed: bool = False,
    ) -> None:
        records = list(queryset.select_related("tenant")[:500])
        if not all(may(request.user, "tenants.change_apikey", r.tenant_id) for r in records):
            raise PermissionDenied("Only the tenant's admins forget its idempotency keys.")
        filters = {
            (record.tenant, tuple(sorted(which(record).items())))
            for record in records
            if record.idempotency_key or not keyed
        }
        forgotten = sum(ledger.invalidate(tenant, **dict(f)) for tenant, f in filters)
        self.message_user(request, f"{forgotten} idempotency key(s) forgotten.", messages.SUCCESS)

    @admin.display(description="Run")
    def run_link(self, record: InvocationRecord) -> str:
        return format_html(
            '<a href="{}">{}</a>',
            links.run_timeline_url(record.run_id, record.tenant.slug),
            record.run_id,
        )

    @admin.display(description="Links")
    def related(self, record: InvocationRecord) -> str:
        return _link_list(links.record_links(record))

    @admin.display(description="Arguments (redacted)")
    def args_json(self, record: InvocationRecord) -> str:
        return _pretty(record.args)

    @admin.display(description="Result (redacted)")
    def result_json(self, record: InvocationRecord) -> str:
        return _pretty(record.result)

    @admin.display(description="Receipt")
    def receipt_view(self, record: InvocationRecord) -> str:
        if not record.receipt:
            return "None yet: a call gets its receipt when it ends."
        return render_to_string("receipts/_receipt.html", {"record": record})

    @admin.display(description="Audit chain")
    def audit_chain(self, record: InvocationRecord) -> str:
        status = verify.record_status(record)
        return format_html(
            '<span class="toolhub-audit toolhub-audit-{}" id="chain-state">{}</span> '
            '<span id="chain-text">{}</span>',
            status.state,
            status.label,
            status.text,
        )

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


@admin.register(RunEvent)
class RunEventAdmin(TenantScopedAdmin):
    """Events are evidence too: readable, never editable or deletable, even by superusers."""

    lean_list = True  # its columns read no JSON
    list_display = (
        "at",
        "run_id",
        "seq",
        "type",
        "tool_id",
        "tool_call_id",
        "tenant",
        "timeline_link",
    )
    # No "type" filter: it lists the column's values, reading every event to do so.
    list_filter = ("tenant",)
    # By the (tenant, run_id, seq) index, without the join on the tenant (its slug) that
    # the model's ordering by "tenant" makes, which sorts every event for each page.
    ordering = ("tenant_id", "run_id", "seq")
    search_fields = ("=run_id", "=tool_call_id")
    exact_search_only = True
    search_help_text = "A run id or tool call id (whole ids only)."
    fields = (
        "tenant",
        "run_id",
        "seq",
        "type",
        "tool_call_id",
        "tool_id",
        "at",
        "related",
        "message_json",
    )
    readonly_fields = ("related", "message_json")

    def get_queryset(self, request: HttpRequest) -> Any:
        return super().get_queryset(request).select_related("tenant")

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[RunEvent], search_term: str
    ) -> tuple[QuerySet[RunEvent], bool]:
        """A run id, or a tool call id, by the (tenant, run_id, seq) index in every tenant:
        the runs searched are the term and the runs of the records of a call by that id (a
        call's events are in its record's run), read first by (tenant, tool_call_id)."""
        term = search_term.strip()
        if not term:
            return queryset, False
        holding_calls = tenants_holding(InvocationRecord, tool_call_id=term)
        calls = InvocationRecord.objects.filter(tenant__in=holding_calls, tool_call_id=term)
        runs = sorted({term, *calls.order_by().values_list("run_id", flat=True)[:100]})
        holding = tenants_holding(RunEvent, run_id__in=runs)
        if runs == [term]:
            # No call has that id: the run's events alone. Without the call's condition
            # (always true then), PostgreSQL estimates the run's rows well enough to read
            # its first page in index order; with it, it guessed 67 of 300,000 at 10^7 and
            # read and sorted them all (200 ms).
            return queryset.filter(tenant__in=holding, run_id=term), False
        matches = Q(run_id=term) | Q(tool_call_id=term)
        return queryset.filter(matches, tenant__in=holding, run_id__in=runs), False

    @admin.display(description="Timeline")
    def timeline_link(self, event: RunEvent) -> str:
        return format_html(
            '<a href="{}">timeline</a>', links.run_timeline_url(event.run_id, event.tenant.slug)
        )

    @admin.display(description="Links")
    def related(self, event: RunEvent) -> str:
        items = [
            links.Link("run timeline", links.run_timeline_url(event.run_id, event.tenant.slug))
        ]
        record = InvocationRecord.objects.filter(
            tenant_id=event.tenant_id, run_id=event.run_id, tool_call_id=event.tool_call_id
        ).first()
        if record is not None:
            url = reverse("admin:invocations_invocationrecord_change", args=[record.pk])
            items.append(links.Link("invocation record", url))
        approval_id = event.message.get("approvalId") if isinstance(event.message, dict) else None
        if approval_id:
            url = reverse("admin:approvals_approvalrequest_change", args=[approval_id])
            items.append(links.Link("approval", url))
        return _link_list(items)

    @admin.display(description="Message (as streamed)")
    def message_json(self, event: RunEvent) -> str:
        return _pretty(event.message)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False
