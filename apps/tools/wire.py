"""Catalog encoders: ToolSpec (our shape) and the OpenAI / Anthropic `tools` shapes.

ToolSpec's `inputSchema` is the schema toolhub validates with. The provider shapes give
the same schema, except where OpenAI's or Anthropic's API refuses what JSON Schema
allows: at the root of `parameters` / `input_schema`, both want `type: "object"` and no
`allOf`/`anyOf`/`oneOf` (nor `not`, `enum`, `const`, conditionals or a `$ref`).
Built-in tools never have those (apps/tools/schema.py); an imported tool's schema is its
server's, so provider_schema moves the properties of such root alternatives into the
root's `properties` (required only from `allOf`, which all apply) and leaves the keywords
out. toolhub still validates every call with the whole schema: what is left out costs
the model a hint, never a check. Neither shape claims OpenAI's strict mode (docs/mcp.md).
"""

from __future__ import annotations

from typing import Any

from apps.policies.policy import Decision
from apps.tools.models import Tool

ROOT_REFUSED = ("allOf", "anyOf", "oneOf", "not", "if", "then", "else", "enum", "const", "$ref")


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
        "dependsOn": list(tool.depends_on),
        "version": tool.version,
        "schemaHash": tool.schema_hash,
    }


def openai_tool(tool: Tool) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": tool.id,
            "description": tool.description,
            "parameters": provider_schema(tool.input_schema),
        },
    }


def anthropic_tool(tool: Tool) -> dict[str, Any]:
    return {
        "name": tool.id,
        "description": tool.description,
        "input_schema": provider_schema(tool.input_schema),
    }


def provider_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """`schema` with an object root that has `properties` and none of ROOT_REFUSED."""
    properties = schema.get("properties")
    if (
        schema.get("type") == "object"
        and isinstance(properties, dict)
        and not any(key in schema for key in ROOT_REFUSED)
    ):
        return schema  # every built-in tool, and most imported ones
    shaped = {key: value for key, value in schema.items() if key not in ROOT_REFUSED}
    merged = dict(properties) if isinstance(properties, dict) else {}
    required = [name for name in _list(schema.get("required")) if isinstance(name, str)]
    alternatives = [("allOf", branch) for branch in _list(schema.get("allOf"))]
    alternatives += [("$ref", schema)] if "$ref" in schema else []
    alternatives += [
        (key, branch) for key in ("anyOf", "oneOf") for branch in _list(schema.get(key))
    ]
    for keyword, branch in alternatives:
        target = _resolve(schema, branch)
        branch_properties = target.get("properties")
        if isinstance(branch_properties, dict):
            for name, sub in branch_properties.items():
                merged.setdefault(name, sub)
        if keyword in ("allOf", "$ref"):
            names = [name for name in _list(target.get("required")) if isinstance(name, str)]
            required += [name for name in names if name not in required]
    shaped["type"] = "object"
    shaped["properties"] = merged
    if required:
        shaped["required"] = required
    return shaped


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _resolve(root: dict[str, Any], node: Any) -> dict[str, Any]:
    """A branch, or what its local `$ref` (#/$defs/X, #/definitions/X) names; else {}."""
    if not isinstance(node, dict):
        return {}
    ref = node.get("$ref")
    if not isinstance(ref, str):
        return node
    for prefix in ("#/$defs/", "#/definitions/"):
        if ref.startswith(prefix):
            defs = root.get(prefix[2:-1])
            target = defs.get(ref.removeprefix(prefix)) if isinstance(defs, dict) else None
            return target if isinstance(target, dict) else {}
    return {}
