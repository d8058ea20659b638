from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.db.models.signals import post_delete


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
        post_delete.connect(_retire_tool, sender="mcp.McpTool", dispatch_uid="mcp-retire-tool")

        from apps.mcp.server import notifications

        # toolhub's own MCP server: open streams hear when a tenant's catalog changes.
        notifications.connect()


def _retire_tool(sender: Any, instance: Any, **kwargs: Any) -> None:
    """A deleted import (or server) leaves its catalog row for the records that name it,
    disabled and no longer provided."""
    from apps.tools.models import Tool

    Tool.objects.filter(pk=instance.tool_id).update(enabled=False, available=False)
