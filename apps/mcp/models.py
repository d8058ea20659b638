"""MCP servers registered by staff and the tools imported from them (see docs/mcp.md)."""

from __future__ import annotations
