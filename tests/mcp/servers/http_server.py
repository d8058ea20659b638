"""A streamable HTTP MCP server (official SDK) for tests: python http_server.py PORT [TOKEN].

With TOKEN, every request without `Authorization: Bearer TOKEN` is refused with HTTP 401,
tools/list included: a server that cannot even be discovered without a tenant's credential.
"""

from __future__ import annotations

import sys
from typing import Any

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


def bearer_only(inner: Any, token: str) -> Any:
    """Plain ASGI: HTTP requests must carry the bearer token, or get 401."""
    expected = f"Bearer {token}".encode()

    async def guarded(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and dict(scope["headers"]).get(b"authorization") != expected:
            await send({"type": "http.response.start", "status": 401, "headers": []})
            await send({"type": "http.response.body", "body": b"credentials required"})
            return
        await inner(scope, receive, send)

    return guarded


if __name__ == "__main__":
    asgi = app.streamable_http_app()
    if len(sys.argv) > 2:
        asgi = bearer_only(asgi, sys.argv[2])
    uvicorn.run(asgi, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
