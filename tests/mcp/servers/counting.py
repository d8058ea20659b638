"""An MCP server (official SDK) that writes down every call it runs, for the tests of
sessions that outlive a restart: python counting.py RUNS [--port N] [--start-delay S].

Over stdio without --port, over streamable HTTP on 127.0.0.1:N with it (the tests stop
it and start it again on the same port). Every tool call first appends one line
"<tool> <tag> <pid>" to the file RUNS, before it does anything else: a test reads there
how many times the server ran a request, whichever of its processes ran it.

--start-delay S: sleep S seconds before serving (a slow cold start; 600 never starts).
Over HTTP, the ids of the sessions it opens are appended to RUNS.sessions (a test ends
them with DELETE, as the server's idle timeout would). MCP_LOST_SESSION_STATUS=400: a
request naming a session this process did not open is answered 400 "Bad Request: No
valid session ID provided", as servers built on the TypeScript SDK's example code answer
it, instead of the SDK's 404 "Session not found".
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

from mcp.server.mcpserver import MCPServer

parser = argparse.ArgumentParser()
parser.add_argument("runs")
parser.add_argument("--port", type=int)
parser.add_argument("--start-delay", type=float, default=0.0)
options = parser.parse_args()
app = MCPServer("counting")


def ran(tool: str, tag: str) -> None:
    with open(options.runs, "a") as runs:
        runs.write(f"{tool} {tag} {os.getpid()}\n")


@app.tool(description="Count one run under `tag` (not idempotent: each run is a line).")
def bump(tag: str = "-") -> str:
    ran("bump", tag)
    return tag


@app.tool(description="Count one run under `tag`, then take `seconds` to answer.")
def bump_slowly(seconds: float, tag: str = "-") -> str:
    ran("bump_slowly", tag)
    time.sleep(seconds)
    return tag


@app.tool(description="The server's process id.")
def pid() -> int:
    return os.getpid()


def noting_sessions(inner: Any, answer_lost_with_400: bool) -> Any:
    """Plain ASGI: writes down the session ids the SDK issues; with `answer_lost_with_400`,
    a session id this process never issued gets a 400, not the SDK's 404."""
    issued: set[bytes] = set()
    body = json.dumps(
        {
            "jsonrpc": "2.0",
            "error": {"code": -32000, "message": "Bad Request: No valid session ID provided"},
            "id": None,
        }
    ).encode()

    async def serve(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await inner(scope, receive, send)
            return
        named = dict(scope["headers"]).get(b"mcp-session-id")
        if answer_lost_with_400 and named is not None and named not in issued:
            headers = [(b"content-type", b"application/json")]
            await send({"type": "http.response.start", "status": 400, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return

        async def noting(message: Any) -> None:
            if message["type"] == "http.response.start":
                for name, value in message.get("headers", []):
                    if name == b"mcp-session-id" and value not in issued:
                        issued.add(value)
                        with open(f"{options.runs}.sessions", "a") as sessions:
                            sessions.write(value.decode() + "\n")
            await send(message)

        await inner(scope, receive, noting)

    return serve


if __name__ == "__main__":
    time.sleep(options.start_delay)
    if options.port is None:
        app.run()
    else:
        import uvicorn

        answer_lost_with_400 = os.environ.get("MCP_LOST_SESSION_STATUS") == "400"
        asgi = noting_sessions(app.streamable_http_app(), answer_lost_with_400)
        uvicorn.run(asgi, host="127.0.0.1", port=options.port, log_level="warning")
