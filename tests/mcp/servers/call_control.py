"""An MCP server (official SDK) for the call-control tests: `stdio LOG` or `http PORT LOG`.

LOG (a file path): the server appends one line per event there,
`started <tag>` when `wait_for_cancel` begins and `cancelled <tag>` when the request is
cancelled under it (the SDK cancels the handler on `notifications/cancelled`, or when
the request's POST is closed), so a test reads what the server itself saw.

Over HTTP, `flaky(key, ...)` is answered by the ASGI layer, before the SDK, with
`status` and `Retry-After: retry_after` for the first `fails` calls with that key,
then by the tool: a server that is busy, then serves. `hinted` fails with a JSON-RPC
error whose data carries `retryAfterMs`, then succeeds, per key likewise.
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from typing import Any

import anyio
import uvicorn
from mcp.server.mcpserver import MCPServer
from mcp.shared.exceptions import MCPError

app = MCPServer("call-control")
seen: Counter[str] = Counter()


def note(line: str) -> None:
    with open(sys.argv[-1], "a") as log:
        log.write(line + "\n")


@app.tool(description="Block until the call is cancelled; the log says it was.")
async def wait_for_cancel(tag: str) -> str:
    note(f"started {tag}")
    try:
        await anyio.sleep_forever()
    except anyio.get_cancelled_exc_class():
        note(f"cancelled {tag}")
        raise
    return "never"


@app.tool(description="The server's process id (whether a session outlived a cancel).")
def pid() -> int:
    return os.getpid()


@app.tool(description="Answered by the HTTP layer while busy, then here.")
def flaky(key: str, fails: int = 1, status: int = 503, retry_after: str = "1") -> str:
    return f"served {key}"


@app.tool(description="A JSON-RPC error carrying retryAfterMs for the first `fails` calls.")
def hinted(key: str, fails: int = 1, retry_after_ms: int = 100) -> str:
    seen[f"hinted {key}"] += 1
    if seen[f"hinted {key}"] <= fails:
        raise MCPError(code=-32001, message="busy", data={"retryAfterMs": retry_after_ms})
    return f"served {key}"


def busy_first(inner: Any) -> Any:
    """Plain ASGI: a tools/call of `flaky` is answered `status` + Retry-After while its
    key has been seen at most `fails` times."""

    async def guarded(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await inner(scope, receive, send)
            return
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        body = b"".join(chunks)
        try:
            request = json.loads(body)
        except ValueError:
            request = None
        params = request.get("params") if isinstance(request, dict) else None
        if isinstance(params, dict) and params.get("name") == "flaky":
            arguments = params.get("arguments") or {}
            key = f"flaky {arguments.get('key')}"
            seen[key] += 1
            if seen[key] <= int(arguments.get("fails", 1)):
                status = int(arguments.get("status", 503))
                headers = [(b"retry-after", str(arguments.get("retry_after", "1")).encode())]
                await send({"type": "http.response.start", "status": status, "headers": headers})
                await send({"type": "http.response.body", "body": b"busy, come back later"})
                return
        replayed = False

        async def replay() -> Any:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await inner(scope, replay, send)

    return guarded


if __name__ == "__main__":
    if sys.argv[1] == "stdio":
        app.run()
    else:
        asgi = busy_first(app.streamable_http_app())
        uvicorn.run(asgi, host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")
