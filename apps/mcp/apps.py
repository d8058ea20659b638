from __future__ import annotations

from django.apps import AppConfig


class McpConfig(AppConfig):
    """MCP on both sides: remote MCP servers as a tool source, and toolhub as an MCP server."""

    name = "apps.mcp"
    label = "mcp"
    verbose_name = "MCP"

    def ready(self) -> None:
        from apps.mcp.discovery import sync_on_list_changed
        from apps.mcp.sessions import pool

        # A server announcing new tools is re-synced; nothing it adds is enabled.
        pool.list_changed = sync_on_list_changed

        from apps.mcp.server import notifications

        # toolhub's own MCP server: open streams hear when a tenant's catalog changes.
        notifications.connect()
