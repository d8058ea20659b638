"""MCP servers and their imported tools: superusers only.

A server decides what toolhub runs (a stdio command) or contacts (a URL) for every
tenant, so tenant staff do not even see it; credentials per tenant are rows of the
server's page, connections of that tenant.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html

from apps.mcp import discovery
from apps.mcp.models import McpServer, McpServerCredential, McpTool
from apps.mcp.sessions import pool
from apps.tenants.admin import SuperusersOnly
from apps.tools.models import Effect


def effect_from_hints(annotations: dict[str, Any]) -> str:
    """The effect a server's hints claim, by the mapping toolhub's own hints use in
    reverse (apps/mcp/server/tools.py `hints`): readOnlyHint true is read_only; else an
    explicit openWorldHint false (the tool changes only the system it serves) is
    state_change; else, openWorldHint true or left out (MCP's default), it is
    external_side_effect. destructiveHint and idempotentHint do not change the effect
    (destructiveness is the consequence level, which stays the admin's)."""
    if annotations.get("readOnlyHint") is True:
        return Effect.READ_ONLY
    if annotations.get("openWorldHint") is False:
        return Effect.STATE_CHANGE
    return Effect.EXTERNAL_SIDE_EFFECT


class CredentialInline(admin.TabularInline[McpServerCredential, McpServer]):
    model = McpServerCredential
    extra = 0
    autocomplete_fields = ()
    verbose_name_plural = "credentials per tenant (HTTP servers: a connection of that tenant)"


@admin.register(McpServer)
class McpServerAdmin(SuperusersOnly):
    list_display = ("name", "transport", "target", "enabled", "last_synced_at", "last_error")
    readonly_fields = ("last_synced_at", "last_error", "created_at")
    inlines = (CredentialInline,)
    actions = ("sync",)

    @admin.display(description="URL or command")
    def target(self, obj: McpServer) -> str:
        return obj.url or obj.command

    def save_model(self, request: HttpRequest, obj: McpServer, form: Any, change: bool) -> None:
        super().save_model(request, obj, form, change)
        pool.close_server(obj.name)  # the next call starts a session with the new settings

    @admin.action(description="Discover tools (sync); new and changed tools stay disabled")
    def sync(self, request: HttpRequest, queryset: QuerySet[McpServer]) -> None:
        """Lists with the server's only tenant credential, if it has one; a server with
        several is refused with a message (mcp_sync --tenant chooses)."""
        for server in queryset:
            try:
                report = discovery.sync_server(server)
            except discovery.SyncFailed as exc:
                self.message_user(request, f"{server.name}: {exc}", messages.ERROR)
                continue
            listed_with = (
                f" (listed with tenant {report.tenant}'s credential)" if report.tenant else ""
            )
            self.message_user(
                request,
                f"{server.name}: {len(report.created)} new, {len(report.changed)} changed, "
                f"{len(report.unusable)} unusable, {len(report.gone)} gone{listed_with}.",
                messages.SUCCESS,
            )
            for error in report.errors:
                self.message_user(request, f"{server.name}: {error}", messages.ERROR)


@admin.register(McpTool)
class McpToolAdmin(SuperusersOnly):
    """What an admin decides about an imported tool: its effect (the server's hints only
    when an admin applies them, row by row), consequence, confirmation, and whether to
    accept a changed description or schema."""

    list_display = ("tool", "server", "effect", "enabled", "usable", "change_pending")
    list_filter = ("server", "effect")
    fields = (
        "tool", "server", "remote_name", "description", "effect", "consequence_level",
        "requires_confirmation", "redaction_args", "annotations_hint", "unusable_reason",
        "pending_since", "change_diff", "input_schema",
    )  # fmt: skip
    readonly_fields = (
        "tool", "server", "remote_name", "description", "annotations_hint", "unusable_reason",
        "pending_since", "change_diff", "input_schema",
    )  # fmt: skip
    actions = ("accept_change", "apply_server_hints")

    def has_add_permission(self, request: HttpRequest, *args: Any) -> bool:
        return False  # imported by discovery only

    @admin.display(boolean=True)
    def enabled(self, obj: McpTool) -> bool:
        return obj.tool.enabled

    @admin.display(boolean=True)
    def usable(self, obj: McpTool) -> bool:
        return not obj.unusable_reason

    @admin.display(boolean=True)
    def change_pending(self, obj: McpTool) -> bool:
        return obj.has_pending_change

    @admin.display(description="Server's annotations (hints, not trusted)")
    def annotations_hint(self, obj: McpTool) -> str:
        return ", ".join(f"{key}={value}" for key, value in obj.annotations.items()) or "none"

    @admin.display(description="Change declared by the server")
    def change_diff(self, obj: McpTool) -> str:
        diff = obj.pending_diff()
        return format_html("<pre>{}</pre>", diff) if diff else "none"

    def save_model(self, request: HttpRequest, obj: McpTool, form: Any, change: bool) -> None:
        discovery.apply_to_catalog(obj)  # the catalog row carries effect and confirmation

    @admin.action(description="Accept the declared change (re-enables only if enabled before)")
    def accept_change(self, request: HttpRequest, queryset: QuerySet[McpTool]) -> None:
        for row in queryset.select_related("tool", "server"):
            discovery.accept_change(row)
        self.message_user(request, "Accepted.", messages.SUCCESS)

    @admin.action(description="Apply the server's hints as the effect")
    def apply_server_hints(self, request: HttpRequest, queryset: QuerySet[McpTool]) -> None:
        """Only the selected rows, never on sync: hints are the server's claim."""
        changed = []
        for row in queryset.select_related("tool", "server"):
            effect = effect_from_hints(row.annotations or {})
            if effect == row.effect:
                continue
            changed.append(f"{row.tool_id}: {row.effect} → {effect}")
            row.effect = effect
            discovery.apply_to_catalog(row)
        if changed:
            self.message_user(request, "Effect changed: " + "; ".join(changed), messages.SUCCESS)
        else:
            self.message_user(request, "Nothing changed: the effects already match the hints.")
