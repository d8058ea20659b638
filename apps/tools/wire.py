"""Catalog encoders: ToolSpec (our shape) and the OpenAI / Anthropic `tools` shapes."""

from __future__ import annotations

from typing import Any

from apps.policies.policy import Decision
from apps.tools.models import Tool


def tool_spec(tool: Tool, decision: Decision) -> dict[str, Any]:
    return {
        "id": tool.id,
        "name": tool.name,
        "description": tool.description,
        "inputSchema": tool.input_schema,
        "effect": tool.effect,
        "consequenceLevel": tool.consequence_level,
        "requiresConfirmation": tool.requires_confirmation,
        "requiresApproval": tool.requires_confirmation or decision.requires_approval,
        "requiresConnection": tool.requires_connection,
        "timeoutMs": tool.timeout_ms,
        "tags": list(tool.tags),
        "version": tool.version,
        "schemaHash": tool.schema_hash,
    }


def openai_tool(tool: Tool) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": tool.id,
            "description": tool.description,
            "parameters": tool.input_schema,
        },
    }


def anthropic_tool(tool: Tool) -> dict[str, Any]:
    return {"name": tool.id, "description": tool.description, "input_schema": tool.input_schema}
