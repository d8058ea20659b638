"""Stdio MCP servers whose tools declare JSON Schema as the world writes it, by argv[1].

typed: the official SDK's MCPServer (FastMCP) with pydantic arguments: Optional fields,
nested models, enums, Literal, list[Model], dict[str, int]. Every tool answers with the
arguments exactly as it received them (`received`, before the SDK parsed them) and as the
SDK parsed them (`parsed`), so a test sees an explicit null arrive as null.

declared: the SDK's low-level Server listing hand-written schemas verbatim: keywords
pydantic does not write (const, prefixItems, patternProperties, oneOf, definitions) and
schemas that cannot be used (a $ref to nothing, an invalid pattern, a remote $ref,
a connectionId argument), beside a plain tool. Every call echoes its arguments.

bare: no SDK, JSON-RPC lines written by hand, for what an SDK server refuses to send:
a tool whose inputSchema is `{}`, beside a plain one.
"""

from __future__ import annotations

import json
import sys
from enum import Enum
from typing import Any, Literal

import anyio
from pydantic import BaseModel, Field

mode = sys.argv[1] if len(sys.argv) > 1 else "typed"


class Colour(Enum):
    RED = "red"
    GREEN = "green"


class Address(BaseModel):
    street: str
    city: str | None = None


class Item(BaseModel):
    sku: str = Field(pattern=r"^[A-Z]{3}-\d+$")
    quantity: int = Field(ge=1, le=100)


def typed() -> None:
    from mcp.server.mcpserver import MCPServer

    received: dict[str, Any] = {}

    class Recording(MCPServer):
        async def call_tool(self, name: str, arguments: dict[str, Any], context: Any = None) -> Any:
            received[name] = json.loads(json.dumps(arguments))
            return await super().call_tool(name, arguments, context)

    app = Recording("typed")

    def answer(name: str, parsed: dict[str, Any]) -> str:
        return json.dumps({"received": received.get(name), "parsed": parsed}, default=str)

    @app.tool(description="Place an order: nested models, a list of them, enums, Literal.")
    def place_order(
        customer: str,
        items: list[Item],
        ship_to: Address | None = None,
        colour: Colour = Colour.RED,
        speed: Literal["slow", "fast"] = "slow",
        note: str | None = None,
        counts: dict[str, int] | None = None,
    ) -> str:
        parsed = {
            "customer": customer,
            "items": [item.model_dump() for item in items],
            "ship_to": ship_to.model_dump() if ship_to else None,
            "colour": colour.value,
            "speed": speed,
            "note": note,
            "counts": counts,
        }
        return answer("place_order", parsed)

    @app.tool(description="Echo an optional text.")
    def maybe(text: str | None = None) -> str:
        return answer("maybe", {"text": text})

    app.run()


DECLARED: dict[str, dict[str, Any]] = {
    "tagged": {
        "type": "object",
        "properties": {
            "kind": {"const": "point"},
            "at": {
                "type": "array",
                "prefixItems": [{"type": "number"}, {"type": "number"}],
                "items": False,
            },
            "labels": {
                "type": "object",
                "patternProperties": {"^x-": {"type": "string"}},
                "additionalProperties": False,
            },
            "size": {"oneOf": [{"type": "integer"}, {"$ref": "#/definitions/Named"}]},
            "when": {"type": "string", "format": "date-time", "default": "now"},
        },
        "required": ["kind", "at"],
        "definitions": {"Named": {"enum": ["small", "large"]}},
    },
    "plain": {"type": "object", "properties": {"value": {"type": "integer"}}},
    "dangling": {"type": "object", "properties": {"v": {"$ref": "#/$defs/Missing"}}},
    "bad_pattern": {"type": "object", "properties": {"v": {"type": "string", "pattern": "(a"}}},
    "remote": {"type": "object", "properties": {"v": {"$ref": "https://schemas.example/v.json"}}},
    "with_connection": {"type": "object", "properties": {"connectionId": {"type": "string"}}},
}


def declared() -> None:
    from mcp import types
    from mcp.server.lowlevel import Server
    from mcp.server.stdio import stdio_server

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(
            tools=[
                types.Tool(name=name, description=f"The {name} tool.", input_schema=schema)
                for name, schema in DECLARED.items()
            ]
        )

    async def call_tool(ctx: Any, params: Any) -> types.CallToolResult:
        text = json.dumps({"tool": params.name, "received": params.arguments})
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)])

    app = Server("declared", on_list_tools=list_tools, on_call_tool=call_tool)

    async def main() -> None:
        async with stdio_server() as (read, write):
            await app.run(read, write, app.create_initialization_options())

    anyio.run(main)


def bare() -> None:
    tools = [
        {"name": "anything", "description": "Takes any arguments.", "inputSchema": {}},
        {"name": "plain", "description": "A plain one.", "inputSchema": DECLARED["plain"]},
    ]
    for line in sys.stdin:
        message = json.loads(line)
        method, ident = message.get("method"), message.get("id")
        if ident is None:
            continue  # a notification
        if method == "initialize":
            result: dict[str, Any] = {
                "protocolVersion": message["params"]["protocolVersion"],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "bare", "version": "1"},
            }
        elif method == "tools/list":
            result = {"tools": tools}
        elif method == "tools/call":
            text = json.dumps({"received": message["params"].get("arguments")})
            result = {"content": [{"type": "text", "text": text}]}
        else:
            result = {}
        sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": ident, "result": result}) + "\n")
        sys.stdout.flush()


if mode == "typed":
    typed()
elif mode == "declared":
    declared()
elif mode == "bare":
    bare()
