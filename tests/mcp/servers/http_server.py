"""A streamable HTTP MCP server (official SDK) for tests: python http_server.py PORT [TOKEN].

With TOKEN, every request without `Authorization: Bearer TOKEN` is refused with HTTP 401,
tools/list included: a server that cannot even be discovered without a tenant's credential.

With MCP_HTTP_SEEN (a file path) set, the server writes down every Authorization header a
tool call brought, and offers tools that echo it back in the shapes a careless or hostile
server would (encoded, in an error, after a pause): the secret scrubbing tests.

The message size limit tests: MCP_HTTP_SIZED=1 adds `sized(size)`, which answers `size`
characters; MCP_HTTP_HUGE_LISTING=1 adds a tool whose description makes tools/list's
answer larger than 1 MiB; MCP_HTTP_JSON_RESPONSE=1 answers with JSON bodies, not SSE.
"""

from __future__ import annotations

import base64
import os
import sys
import time
from typing import Annotated, Any, Literal
from urllib.parse import quote

import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.transport_security import TransportSecuritySettings
from mcp.types import ToolAnnotations
from pydantic import Field

app = MCPServer("http-test")


@app.tool(description="Add two integers.")
def add(a: int, b: int) -> int:
    return a + b


def _received(ctx: Context) -> str:
    """The Authorization header of the request, written down where the test can read it."""
    request = ctx.request_context.request
    header = str((getattr(request, "headers", {}) or {}).get("authorization", "anonymous"))
    if os.environ.get("MCP_HTTP_SEEN"):
        with open(os.environ["MCP_HTTP_SEEN"], "a") as seen:
            seen.write(header + "\n")
    return header


@app.tool(description="Which Authorization header reached the server (for credential tests).")
def whoami(ctx: Context) -> str:
    return _received(ctx)


if os.environ.get("MCP_HTTP_SEEN"):

    @app.tool(description="Echo the Authorization header back, encoded.")
    def echo_encoded(ctx: Context) -> dict[str, str]:
        header = _received(ctx)
        token = header.removeprefix("Bearer ")
        return {
            "base64": base64.b64encode(header.encode()).decode(),
            "urlsafe": base64.urlsafe_b64encode(token.encode()).decode().rstrip("="),
            "percent": quote(header, safe=""),
        }

    @app.tool(description="Fail, quoting the Authorization header.")
    def echo_error(ctx: Context) -> str:
        raise ToolError(f"refused the request with {_received(ctx)}")  # shown to the client

    @app.tool(description="Echo the Authorization header after `seconds`.")
    def echo_later(ctx: Context, seconds: float) -> str:
        header = _received(ctx)
        time.sleep(seconds)
        return header

    @app.tool(description="Echo the text and the Authorization header.")
    def echo(ctx: Context, text: str) -> str:
        return f"{text} / {_received(ctx)}"


LEAKED_NOTE = ""


def leak_into_listing(token: str) -> None:
    """MCP_HTTP_LEAKY_LISTING: tools whose declarations carry the token the server
    requires, as a careless or hostile server could echo it into its tools/list answer
    (the discovery scrubbing tests). The tool named with the token is listed too."""
    header = f"Bearer {token}"

    @app.tool(description=f"Send {header} when calling.")
    def leaky_description() -> str:
        return "ok"

    encoded = base64.b64encode(header.encode()).decode()

    @app.tool(description=f"Encoded: {encoded}.")
    def leaky_encoded() -> str:
        return "ok"

    global LEAKED_NOTE  # annotations are evaluated in the module's namespace
    LEAKED_NOTE = f"defaults to {token}"

    @app.tool(description="Its schema quotes the token.")
    def leaky_schema(
        note: Annotated[str, Field(description=LEAKED_NOTE)] = token,
        mode: Literal["plain", "with-token"] = "plain",
    ) -> str:
        return note

    @app.tool(name=f"tool_{token}", description="Named with the token.")
    def leaky_name() -> str:
        return "ok"

    @app.tool(
        description="Its annotations quote the token.",
        annotations=ToolAnnotations(title=f"Title {token}", read_only_hint=True),
    )
    def leaky_title() -> str:
        return "ok"

    @app.tool(description="Titled with the token.", title=f"Shown as {token}")
    def leaky_tool_title() -> str:
        return "ok"


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


if os.environ.get("MCP_HTTP_SIZED"):

    @app.tool(description="A text of `size` characters (the message size limit tests).")
    def sized(size: int) -> str:
        return "x" * size


if os.environ.get("MCP_HTTP_HUGE_LISTING"):

    @app.tool(description="d" * 2 * 1024 * 1024)  # a tools/list answer past 1 MiB
    def described_at_length() -> str:
        return "ok"


if __name__ == "__main__":
    # MCP_HTTP_JSON_RESPONSE=1: answers are plain JSON bodies instead of SSE streams.
    json_response = os.environ.get("MCP_HTTP_JSON_RESPONSE") == "1"
    # MCP_HTTP_HOST=name: the Host header the server accepts besides its address (a test
    # that reaches it by a name only toolhub's resolver knows).
    security = None
    if os.environ.get("MCP_HTTP_HOST"):
        security = TransportSecuritySettings(allowed_hosts=[os.environ["MCP_HTTP_HOST"]])
    asgi = app.streamable_http_app(json_response=json_response, transport_security=security)
    if len(sys.argv) > 2:
        if os.environ.get("MCP_HTTP_LEAKY_LISTING"):
            leak_into_listing(sys.argv[2])
            asgi = app.streamable_http_app(json_response=json_response)
        asgi = bearer_only(asgi, sys.argv[2])
    uvicorn.run(asgi, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
