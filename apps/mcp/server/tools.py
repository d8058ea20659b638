"""The caller's catalog as MCP tools: same ids as REST, annotations from the effect."""

from __future__ import annotations

import base64
import binascii
from typing import Any

from apps.policies.policy import Decision
from apps.tools.models import ConsequenceLevel, Effect, Tool


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


def mcp_tool(tool: Tool, decision: Decision) -> dict[str, Any]:
    return {
        "name": tool.id,
        "title": tool.name,
        "description": tool.description,
        "inputSchema": tool.input_schema,
        "annotations": hints(tool),
        "_meta": {
            "toolhub/effect": tool.effect,
            "toolhub/consequenceLevel": tool.consequence_level,
            "toolhub/requiresApproval": tool.requires_confirmation or decision.requires_approval,
            "toolhub/schemaHash": tool.schema_hash,
        },
    }


def page(
    catalog: list[tuple[Tool, Decision]], cursor: str | None, size: int
) -> tuple[list[dict[str, Any]], str | None]:
    """One page of tools after the cursor's tool id (ids are stable, the catalog is sorted
    by id), so a tool added or removed between pages neither repeats nor shifts others."""
    after = _decode(cursor) if cursor is not None else None
    rest = [(t, d) for t, d in catalog if after is None or t.id > after]
    chosen = rest[:size]
    more = len(rest) > size
    next_cursor = _encode(chosen[-1][0].id) if more and chosen else None
    return [mcp_tool(t, d) for t, d in chosen], next_cursor


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
