"""The caller's catalog as MCP tools: same ids as REST.

A built-in tool's annotations are derived from its effect. An imported tool shows what its
server declared (title and hints, as MCP clients expect to see them); toolhub's own
judgement of every tool is in `_meta` (`toolhub/effect`, ...), which is what policy uses.
"""

from __future__ import annotations

import base64
import binascii
from bisect import bisect_right
from typing import Any

from apps.mcp.models import McpTool
from apps.policies.policy import Catalog, Decision
from apps.tools.models import ConsequenceLevel, Effect, Source, Tool

# MCP's defaults for hints a server leaves out (ToolAnnotations in the spec): a tool that
# says nothing may write, destroy, repeat differently and reach the open world.
SPEC_HINTS = {
    "readOnlyHint": False,
    "destructiveHint": True,
    "idempotentHint": False,
    "openWorldHint": True,
}


class BadCursor(Exception):
    """A `tools/list` cursor this server did not hand out."""


def hints(tool: Tool) -> dict[str, Any]:
    """MCP's hints, from what toolhub knows of a tool's effect.

    Only read-only tools are read-only. A state change stays inside the system the
    tool serves; an external side effect reaches the open world. Whether a change
    is destructive follows its consequence level: low is not, medium and high are.
    """
    read_only = tool.effect == Effect.READ_ONLY
    return {
        "title": tool.name,
        "readOnlyHint": read_only,
        "destructiveHint": not read_only and tool.consequence_level != ConsequenceLevel.LOW,
        "idempotentHint": read_only,
        "openWorldHint": tool.effect == Effect.EXTERNAL_SIDE_EFFECT,
    }


def declared_hints(tool: Tool, declared: dict[str, Any]) -> dict[str, Any]:
    """An imported tool's hints as its server declared them (McpTool.annotations, which
    also keeps its title), the spec's defaults for those it left out."""
    title = declared.get("title")
    annotations: dict[str, Any] = {
        "title": title if isinstance(title, str) and title else tool.name
    }
    for key, default in SPEC_HINTS.items():
        value = declared.get(key)
        annotations[key] = value if isinstance(value, bool) else default
    return annotations


def mcp_tool(
    tool: Tool, decision: Decision, declared: dict[str, Any] | None = None
) -> dict[str, Any]:
    """`declared`: an imported tool's McpTool.annotations (None for a built-in tool)."""
    annotations = hints(tool) if declared is None else declared_hints(tool, declared)
    return {
        "name": tool.id,
        "title": annotations["title"],
        "description": tool.description,
        "inputSchema": tool.input_schema,
        "annotations": annotations,
        "_meta": {
            "toolhub/effect": tool.effect,
            "toolhub/consequenceLevel": tool.consequence_level,
            "toolhub/requiresApproval": tool.requires_confirmation or decision.requires_approval,
            "toolhub/schemaHash": tool.schema_hash,
            "toolhub/dependsOn": list(tool.depends_on),
        },
    }


def page(
    catalog: list[tuple[Tool, Decision]], cursor: str | None, size: int
) -> tuple[list[dict[str, Any]], str | None]:
    """One page of tools after the cursor's tool id (ids are stable, the catalog is sorted
    by id), so a tool added or removed between pages neither repeats nor shifts others."""
    after = _decode(cursor) if cursor is not None else None
    if after is None:
        rest = catalog  # the first page: no pass over 10,000 tools (issue 45)
    elif isinstance(catalog, Catalog) and catalog.in_id_order:
        rest = catalog[bisect_right(catalog, after, key=_tool_id) :]
    else:
        rest = [(t, d) for t, d in catalog if t.id > after]
    chosen = rest[:size]
    more = len(rest) > size
    next_cursor = _encode(chosen[-1][0].id) if more and chosen else None
    imported = [t.id for t, _ in chosen if t.source == Source.MCP]
    declared: dict[str, dict[str, Any]] = (
        dict(McpTool.objects.filter(tool_id__in=imported).values_list("tool_id", "annotations"))
        if imported
        else {}
    )
    listed = [
        mcp_tool(t, d, declared.get(t.id, {}) if t.source == Source.MCP else None)
        for t, d in chosen
    ]
    return listed, next_cursor


def _tool_id(item: tuple[Tool, Decision]) -> str:
    return item[0].id


def _encode(tool_id: str) -> str:
    return base64.urlsafe_b64encode(f"after:{tool_id}".encode()).decode()


def _decode(cursor: str) -> str:
    try:
        text = base64.urlsafe_b64decode(cursor.encode("ascii")).decode()
    except (binascii.Error, UnicodeError, ValueError) as exc:
        raise BadCursor("This cursor was not handed out by tools/list.") from exc
    if not text.startswith("after:"):
        raise BadCursor("This cursor was not handed out by tools/list.")
    return text[len("after:") :]
