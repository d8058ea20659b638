from __future__ import annotations

from django.apps import AppConfig


class McpConfig(AppConfig):
    """MCP on both sides: remote MCP servers as a tool source, and toolhub as an MCP server."""

    name = "apps.mcp"
    label = "mcp"
    verbose_name = "MCP"
