"""A streamable HTTP MCP server (official SDK) for tests: python http_server.py PORT."""

from __future__ import annotations

import sys

import uvicorn
from mcp.server.mcpserver import Context, MCPServer

app = MCPServer("http-test")


@app.tool(description="Add two integers.")
def add(a: int, b: int) -> int:
    return a + b


@app.tool(description="Which Authorization header reached the server (for credential tests).")
def whoami(ctx: Context) -> str:
    request = ctx.request_context.request
    headers = getattr(request, "headers", {}) or {}
    return str(headers.get("authorization", "anonymous"))


if __name__ == "__main__":
    uvicorn.run(
        app.streamable_http_app(), host="127.0.0.1", port=int(sys.argv[1]), log_level="warning"
    )
