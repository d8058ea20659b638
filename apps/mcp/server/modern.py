"""MCP 2026-07-28: the stateless revision, answered over the same catalog and runner.

No `initialize`, no session: each request carries its protocol version, client info
and capabilities in `params._meta`, and over HTTP its `MCP-Protocol-Version`,
`Mcp-Method` and (for the methods that name something) `Mcp-Name` headers, which
must agree with the body (`envelope`). `server/discover` says what this server
speaks. A held call becomes a task of the Tasks extension (`io.modelcontextprotocol/
tasks`) when the request declares that extension: its id is the invocation id, and
`tasks/get` reports it until it is decided and run, then carries its CallToolResult.
A client without the extension gets the held call's answer as the older revisions do.
`subscriptions/listen` (a stream, see transport.py) carries `tools/list_changed`.

Cache hints on `tools/list`: the catalog is the caller's own (per key, principal and
the policies in force), so `cacheScope` is `private` (never shared across API keys)
and `ttlMs` is short (LIST_TTL_MS); a listen stream tells a client to list again at
once when an admin changes policies or tools, and policy is checked again on every
call, so a stale listing can show a tool the caller may no longer use, never run it.
"""

from __future__ import annotations

import contextlib
from typing import Any

from mcp.shared.inbound import decode_header_value, validate_mcp_param_headers

from apps.invocations import cancellation
from apps.invocations.models import InvocationRecord, Status
from apps.mcp.server import methods
from apps.mcp.server.methods import FINISHED, INVALID_PARAMS, METHOD_NOT_FOUND, RpcError
from apps.mcp.server.sessions import Session
from apps.tenants.callers import Caller
from apps.tools.models import Tool

VERSION = "2026-07-28"
SUPPORTED_VERSIONS = (*methods.PROTOCOL_VERSIONS, VERSION)

HEADER_MISMATCH = -32020
MISSING_CAPABILITY = -32021
UNSUPPORTED_VERSION = -32022
# HTTP status of a JSON-RPC error in this revision (an unlisted code is 200).
HTTP_STATUS = {
    methods.PARSE_ERROR: 400,
    methods.INVALID_REQUEST: 400,
    INVALID_PARAMS: 400,
    HEADER_MISMATCH: 400,
    MISSING_CAPABILITY: 400,
    UNSUPPORTED_VERSION: 400,
    METHOD_NOT_FOUND: 404,
}

VERSION_KEY = "io.modelcontextprotocol/protocolVersion"
CAPABILITIES_KEY = "io.modelcontextprotocol/clientCapabilities"
CLIENT_INFO_KEY = "io.modelcontextprotocol/clientInfo"
SERVER_INFO_KEY = "io.modelcontextprotocol/serverInfo"
SUBSCRIPTION_KEY = "io.modelcontextprotocol/subscriptionId"
TASKS = "io.modelcontextprotocol/tasks"
SERVER_INFO = {"name": "toolhub", "title": "toolhub", "version": "1"}

# tools/list: private to the key, fresh for 30 s (see the module docstring).
LIST_TTL_MS = 30_000
# server/discover says the same to everyone; it changes only with a deployment.
DISCOVER_TTL_MS = 300_000

# Methods whose Mcp-Name header mirrors a body field.
TASK_METHODS = ("tasks/get", "tasks/update", "tasks/cancel")
NAMED = {"tools/call": "name", **dict.fromkeys(TASK_METHODS, "taskId")}


def envelope(message: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
    """The request's `_meta`, once it carries the envelope and agrees with the routing
    headers (lowercase names), else RpcError; nothing has run yet either way."""
    params = message.get("params")
    meta = params.get("_meta") if isinstance(params, dict) else None
    if not isinstance(meta, dict) or VERSION_KEY not in meta or CAPABILITIES_KEY not in meta:
        raise RpcError(
            INVALID_PARAMS,
            f"A {VERSION} request carries params._meta with {VERSION_KEY!r} and "
            f"{CAPABILITIES_KEY!r} (there is no initialize in this revision).",
        )
    assert isinstance(params, dict)
    version = meta[VERSION_KEY]
    if headers.get("mcp-protocol-version") != version:
        raise RpcError(
            HEADER_MISMATCH,
            "The MCP-Protocol-Version header does not match params._meta's protocol version.",
        )
    method = message.get("method")
    if headers.get("mcp-method") != method:
        raise RpcError(HEADER_MISMATCH, "The Mcp-Method header does not match the body's method.")
    field = NAMED.get(str(method))
    if field is not None and decode_header_value(headers.get("mcp-name")) != params.get(field):
        raise RpcError(
            HEADER_MISMATCH, f"The Mcp-Name header does not match the body's params.{field}."
        )
    if version != VERSION:
        raise RpcError(
            UNSUPPORTED_VERSION,
            f"Unsupported protocol version; this server supports {list(SUPPORTED_VERSIONS)}.",
            unsupported(str(version)),
        )
    if not isinstance(meta[CAPABILITIES_KEY], dict):
        raise RpcError(INVALID_PARAMS, f"params._meta[{CAPABILITIES_KEY!r}] must be an object.")
    return meta


def unsupported(version: str) -> dict[str, Any]:
    """The data of -32022: what is served, and what was asked for."""
    return {"supported": list(SUPPORTED_VERSIONS), "requested": version[:100]}


def declares_tasks(meta: dict[str, Any]) -> bool:
    extensions = meta[CAPABILITIES_KEY].get("extensions")
    return isinstance(extensions, dict) and isinstance(extensions.get(TASKS), dict)


def check_param_headers(params: dict[str, Any], headers: dict[str, str]) -> None:
    """A `tools/call`'s `Mcp-Param-*` headers agree with its arguments, as its tool's
    schema declares them (`x-mcp-header`); checked by the SDK's own validator."""
    tool = Tool.objects.current(str(params.get("name")))
    arguments = params.get("arguments")
    if tool is None or not isinstance(arguments, dict):
        return
    rejection = validate_mcp_param_headers(tool.input_schema, arguments, headers)
    if rejection is not None:
        raise RpcError(HEADER_MISMATCH, rejection.message)


def discover() -> dict[str, Any]:
    return {
        "supportedVersions": list(SUPPORTED_VERSIONS),
        "capabilities": {"tools": {"listChanged": True}, "extensions": {TASKS: {}}},
        "instructions": methods.INSTRUCTIONS,
        "cacheScope": "public",
        "ttlMs": DISCOVER_TTL_MS,
    }


def answer(
    caller: Caller,
    meta: dict[str, Any],
    method: str,
    params: dict[str, Any],
    traceparent: str | None = None,
    headers: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The result of one 2026-07-28 request (without resultType and _meta), or RpcError.

    A run of its own unless named: by `_meta.runId`, or by the narrowing headers
    (`Toolhub-Run-Id`, `Toolhub-Run-Tools`: methods.session_run), read per request."""
    run_id = None
    if headers and method in ("tools/list", "tools/call"):
        run_id = methods.session_run(caller, headers)
    session = Session.start(caller_key(caller), VERSION, run_id)
    if method == "server/discover":
        return discover()
    if method == "tools/list":
        listed = methods.list_tools(caller, session, params)
        return {**listed, "cacheScope": "private", "ttlMs": LIST_TTL_MS}
    if method == "tools/call":
        record = methods.invoke(caller, session, params, traceparent)
        if record.status not in FINISHED and declares_tasks(meta):
            return {**task_of(record), "resultType": "task"}
        return methods.call_result(record)
    if method in TASK_METHODS:
        if not declares_tasks(meta):
            raise missing_tasks_capability()
        record = methods.task_record(caller, params)
        if method == "tasks/get":
            return task_of(record, detailed=True)
        if method == "tasks/cancel":
            # Cooperative: acknowledged even when the call has ended; it ends as it ends.
            with contextlib.suppress(cancellation.NotCancellable):
                cancellation.cancel(record, by=caller.principal)
        return {}  # tasks/update: toolhub's tasks never ask for input; nothing to apply
    raise RpcError(METHOD_NOT_FOUND, f"Method not found: {method}")


def caller_key(caller: Caller) -> int:
    return int(caller.api_key.pk) if caller.api_key is not None else 0


def missing_tasks_capability() -> RpcError:
    return RpcError(
        MISSING_CAPABILITY,
        f"Missing required client capability: the {TASKS} extension.",
        {"requiredCapabilities": {"extensions": {TASKS: {}}}},
    )


def task_of(record: InvocationRecord, *, detailed: bool = False) -> dict[str, Any]:
    """The Tasks extension's Task for a call; `detailed` (tasks/get) adds a finished
    call's CallToolResult. A call that ended, well or not, is `completed` (a tool error is
    a result with isError), one cancelled is `cancelled`; `failed` is for JSON-RPC errors,
    which a recorded call never is."""
    legacy = methods.task_of(record)
    status = "working"
    if record.status == Status.CANCELLED:
        status = "cancelled"
    elif record.status in FINISHED:
        status = "completed"
    task: dict[str, Any] = {
        "taskId": legacy["taskId"],
        "status": status,
        "createdAt": legacy["createdAt"],
        "lastUpdatedAt": legacy["lastUpdatedAt"],
        "ttlMs": None,  # the record is kept like any other
        "pollIntervalMs": methods.TASK_POLL_MS,
    }
    if "statusMessage" in legacy:
        task["statusMessage"] = legacy["statusMessage"]
    if detailed and status == "completed":
        task["result"] = complete(methods.call_result(record))
    return task


def complete(result: dict[str, Any], meta: dict[str, Any] | None = None) -> dict[str, Any]:
    """A result as this revision sends it: `resultType` (unless set) and the server's info."""
    done = {"resultType": "complete", **result}
    done["_meta"] = {**(done.get("_meta") or {}), SERVER_INFO_KEY: SERVER_INFO, **(meta or {})}
    return done
