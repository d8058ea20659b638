"""The JSON-RPC methods of toolhub's MCP server, over the same catalog and runner as REST.

Protocol problems (unknown method, bad params) are JSON-RPC errors; everything that
happens to a call once it reaches the runner (denied, invalid arguments, failed,
held) is a `CallToolResult`, so a model sees it the way it sees any tool result.
These functions are synchronous: the transport runs them in a worker thread.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from pydantic import ValidationError

from apps.invocations import cancellation, runner, runs
from apps.invocations.api.serializers import InvocationSerializer
from apps.invocations.models import InvocationRecord, Status
from apps.invocations.requests import InvocationRequest
from apps.invocations.streams import is_run_id
from apps.mcp.server import tools, tracing
from apps.mcp.server.sessions import Session, new_run_id
from apps.policies.policy import Decision, catalog
from apps.tenants.callers import Caller
from apps.tools import sources
from apps.tools.models import Tool

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603

# Revisions negotiated through `initialize`, oldest first; a client asking for another
# gets the newest (the spec's counter-offer). Later, handshake-free revisions are not
# spoken: `server/discover` is answered "method not found", and clients fall back.
PROTOCOL_VERSIONS = ("2025-03-26", "2025-06-18", "2025-11-25")
LATEST = PROTOCOL_VERSIONS[-1]
# JSON-RPC batches are part of this revision only (2025-06-18 removed them).
BATCH_VERSION = "2025-03-26"
# MCP tasks exist in this revision only: a `tools/call` with `params.task` becomes a task
# whose id is the invocation id, so a held call can be awaited until it is decided.
TASKS_VERSION = "2025-11-25"
TASK_POLL_MS = 1000
FINISHED = (Status.SUCCEEDED, Status.FAILED, Status.CANCELLED)

# Per-run narrowing (session_run): lower case, as the transport reads header names.
RUN_HEADER = "toolhub-run-id"
TOOLS_HEADER = "toolhub-run-tools"

INSTRUCTIONS = (
    "toolhub runs every call through its policies. A call that needs a human decision "
    "answers at once with its approvalId and invocationId; its outcome arrives later on "
    "the REST API (GET /api/v1/invocations/<invocationId>/) and the run's event stream."
)


class RpcError(Exception):
    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data


def initialize(
    api_key_id: int, params: dict[str, Any], run_id: str | None = None
) -> tuple[dict[str, Any], Session]:
    """`run_id`: the run the session's calls join (session_run), else a new one."""
    asked = params.get("protocolVersion")
    if not isinstance(asked, str):
        raise RpcError(INVALID_PARAMS, "initialize needs params.protocolVersion (a string).")
    version = asked if asked in PROTOCOL_VERSIONS else LATEST
    session = Session.start(api_key_id, version, run_id)
    capabilities: dict[str, Any] = {"tools": {"listChanged": True}}
    if version == TASKS_VERSION:
        capabilities["tasks"] = {"cancel": {}, "requests": {"tools": {"call": {}}}}
    result = {
        "protocolVersion": version,
        "capabilities": capabilities,
        "serverInfo": {"name": "toolhub", "title": "toolhub", "version": "1"},
        "instructions": INSTRUCTIONS,
    }
    return result, session


def session_run(caller: Caller, headers: dict[str, str]) -> str | None:
    """The run named or started by a client's headers (per-run narrowing over MCP).

    MCP clients send configured HTTP headers with every request, but their `initialize`
    carries no extra params: so the run comes from `Toolhub-Run-Id` (a run, perhaps started
    by POST /api/v1/runs/ with an allowlist), and `Toolhub-Run-Tools` (tool ids separated
    by commas) starts it with that allowlist, as POST /api/v1/runs/ does, its errors an
    invalid-params error. None: neither header (the session's own new run)."""
    run_id = headers.get(RUN_HEADER)
    if run_id is not None and not is_run_id(run_id):
        raise RpcError(INVALID_PARAMS, "Toolhub-Run-Id: 1-128 characters of A-Z a-z 0-9 . _ : -")
    tools = headers.get(TOOLS_HEADER)
    if tools is None:
        return run_id
    run_id = run_id or new_run_id()
    try:
        runs.start(caller, run_id, [t.strip() for t in tools.split(",") if t.strip()])
    except runs.RunError as exc:
        raise RpcError(INVALID_PARAMS, f"Toolhub-Run-Tools: {exc.message}") from None
    return run_id


def answer(
    caller: Caller,
    session: Session,
    method: str,
    params: dict[str, Any],
    traceparent: str | None = None,
) -> Any:
    """The result of one request in a session, or RpcError."""
    if method == "ping":
        return {}
    if method == "tools/list":
        return list_tools(caller, session, params)
    if method == "tools/call":
        return call_tool(caller, session, params, traceparent)
    if method in ("tasks/get", "tasks/cancel") and session.protocol_version == TASKS_VERSION:
        record = task_record(caller, params)
        if method == "tasks/cancel":
            try:
                record = cancellation.cancel(record, by=caller.principal)
            except cancellation.NotCancellable as exc:
                raise RpcError(INVALID_PARAMS, f"The task cannot be cancelled: {exc}") from exc
        return task_of(record)
    if method == "initialize":
        raise RpcError(INVALID_REQUEST, "This session is already initialized.")
    raise RpcError(METHOD_NOT_FOUND, f"Method not found: {method}")


def list_tools(caller: Caller, session: Session, params: dict[str, Any]) -> dict[str, Any]:
    cursor = params.get("cursor")
    if cursor is not None and not isinstance(cursor, str):
        raise RpcError(INVALID_PARAMS, "cursor must be a string from an earlier tools/list.")
    allowed: list[tuple[Tool, Decision]] = catalog(caller.tenant, caller.principal, caller.user)
    run_id = _named_run(params) or session.run_id
    narrowed = runs.allowlist(caller.tenant, run_id)
    if narrowed is not None:
        allowed = [(tool, decision) for tool, decision in allowed if tool.pk in narrowed]
    try:
        listed, next_cursor = tools.page(allowed, cursor, settings.TOOLHUB_MCP_PAGE_SIZE)
        if session.protocol_version == TASKS_VERSION:
            for tool in listed:
                tool["execution"] = {"taskSupport": "optional"}
    except tools.BadCursor as exc:
        raise RpcError(INVALID_PARAMS, str(exc)) from exc
    result: dict[str, Any] = {"tools": listed}
    if next_cursor is not None:
        result["nextCursor"] = next_cursor
    return result


def _named_run(params: dict[str, Any]) -> str | None:
    """`params._meta.runId`: the run a request names instead of its session's."""
    meta = params.get("_meta") or {}
    run_id = meta.get("runId") if isinstance(meta, dict) else None
    if run_id is None:
        return None
    if not isinstance(run_id, str) or not is_run_id(run_id):
        raise RpcError(
            INVALID_PARAMS, "params._meta.runId: 1-128 characters of A-Z a-z 0-9 . _ : -"
        )
    return run_id


def call_tool(
    caller: Caller, session: Session, params: dict[str, Any], traceparent: str | None = None
) -> dict[str, Any]:
    """One call through the runner; `_meta.runId` names the run, else the session's run."""
    task = params.get("task")
    as_task = task is not None and session.protocol_version == TASKS_VERSION
    if as_task and not isinstance(task, dict):
        raise RpcError(INVALID_PARAMS, "params.task must be an object.")
    record = invoke(caller, session, params, traceparent)
    if as_task:
        # The call runs (or is held) now; the task is its record, polled by tasks/get.
        return {"task": task_of(record)}
    return call_result(record)


def invoke(
    caller: Caller, session: Session, params: dict[str, Any], traceparent: str | None
) -> InvocationRecord:
    """A `tools/call`'s params checked and run through the runner (RpcError before any
    record when they are not a call: an unknown tool, a name or arguments of the wrong
    type); the record keeps the caller's W3C trace context (see tracing.py)."""
    name, arguments = params.get("name"), params.get("arguments")
    meta = params.get("_meta") or {}
    if not isinstance(name, str) or not name:
        raise RpcError(INVALID_PARAMS, "tools/call needs params.name (a tool id).")
    if arguments is not None and not isinstance(arguments, dict):
        raise RpcError(INVALID_PARAMS, "params.arguments must be an object.")
    if not isinstance(meta, dict):
        raise RpcError(INVALID_PARAMS, "params._meta must be an object.")
    if not known_tool(name):
        # A protocol error, as the spec has it for an unknown tool: no call, no record.
        raise RpcError(INVALID_PARAMS, f"Unknown tool: {name[:140]}. tools/list names the tools.")
    try:
        request = InvocationRequest(
            tool_id=name,
            args=arguments or {},
            run_id=meta.get("runId") or session.run_id,
            tool_call_id=meta.get("toolCallId"),
            # The REST body's connectionId (a tool that takes a connection needs one).
            connection_id=meta.get("toolhub/connectionId"),
        )
    except ValidationError as exc:
        fields = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}"
            for e in exc.errors(include_input=False, include_url=False)
        )
        raise RpcError(INVALID_PARAMS, f"Invalid tools/call params ({fields}).") from exc
    record = runner.invoke(caller, request)
    tracing.record(record, tracing.chosen(meta, traceparent))
    return record


def known_tool(tool_id: str) -> bool:
    """Whether a tool of that id exists and is provided (runner step 1's "There is no
    tool" otherwise); a disabled or forbidden tool is known, and the runner answers it
    (a disabled one that no source provides, an unusable import, too: "is disabled")."""
    tool = Tool.objects.current(tool_id)
    if tool is None or not tool.available:
        return False
    return not tool.enabled or sources.get_tool(tool_id) is not None


def task_record(caller: Caller, params: dict[str, Any]) -> InvocationRecord:
    """The caller's own call named by `params.taskId` (an invocation id)."""
    task_id = params.get("taskId")
    try:
        pk = uuid.UUID(str(task_id))
    except ValueError:
        raise RpcError(INVALID_PARAMS, "Unknown taskId.") from None
    record = InvocationRecord.objects.filter(
        pk=pk, tenant=caller.tenant, principal=caller.principal
    ).first()
    if record is None:
        raise RpcError(INVALID_PARAMS, "Unknown taskId.")
    return record


def task_of(record: InvocationRecord) -> dict[str, Any]:
    """The MCP task of a call: working until it ends, then completed, failed or cancelled."""
    if record.status == Status.CANCELLED:
        status, message = "cancelled", record.safe_message
    elif record.status in FINISHED:
        status = "completed" if record.ok else "failed"
        message = "" if record.ok else f"{record.error_code}: {record.safe_message}"
    elif record.status == Status.PENDING_APPROVAL:
        approval = getattr(record, "approval", None)
        status = "working"
        message = f"Held for human approval: approvalId {approval.pk if approval else ''}."
    else:
        status, message = "working", f"The call is {record.status}."
    updated = record.ended_at or record.started_at or record.created_at
    task: dict[str, Any] = {
        "taskId": str(record.pk),
        "status": status,
        "createdAt": _iso(record.created_at),
        "lastUpdatedAt": _iso(updated),
        "ttl": None,  # the record is kept like any other
        "pollInterval": TASK_POLL_MS,
    }
    if message:
        task["statusMessage"] = message
    return task


def task_result(caller: Caller, params: dict[str, Any]) -> dict[str, Any] | None:
    """`tasks/result`: the call's CallToolResult once it has ended, else None (still waiting)."""
    record = task_record(caller, params)
    if record.status not in FINISHED:
        return None
    result = call_result(record)
    result.setdefault("_meta", {})["io.modelcontextprotocol/related-task"] = {
        "taskId": str(record.pk)
    }
    return result


def _iso(moment: Any) -> str:
    return str(moment.isoformat().replace("+00:00", "Z"))


def call_result(record: InvocationRecord) -> dict[str, Any]:
    """A CallToolResult: the text a model reads, and the REST record as structuredContent;
    an ended call's signed receipt in `_meta["toolhub/receipt"]` (not in what the model
    reads: a client keeps it, a model has no use for it)."""
    body = json.loads(json.dumps(InvocationSerializer(record).data, cls=DjangoJSONEncoder))
    receipt = body.pop("receipt", None)
    result = _call_result(record, body)
    if receipt:
        result.setdefault("_meta", {})["toolhub/receipt"] = receipt
    return result


def _call_result(record: InvocationRecord, body: dict[str, Any]) -> dict[str, Any]:
    if record.status == Status.PENDING_APPROVAL:
        text = (
            f"The call is held for human approval: approvalId {body.get('approvalId')}, "
            f"invocationId {body['invocationId']}. Its outcome is not known yet."
        )
        return _result(text, body, is_error=False)
    if record.status in (Status.QUEUED, Status.RUNNING):
        text = f"The call is still running: invocationId {body['invocationId']}."
        return _result(text, body, is_error=False)
    if record.ok:
        passed = _imported_result(record, body)
        if passed is not None:
            return passed
        text = json.dumps(body.get("result"), cls=DjangoJSONEncoder)
        return _result(text, body, is_error=False)
    if record.result is not None:  # a failure the tool reported (an MCP server's isError)
        passed = _imported_result(record, {**body, "result": record.result})
        if passed is not None:
            return passed
    text = f"{body.get('errorCode')}: {body.get('safeMessage', '')}"
    return _result(text, body, is_error=True)


def _imported_result(record: InvocationRecord, body: dict[str, Any]) -> dict[str, Any] | None:
    """An imported tool's answer as its server sent it (after redaction, as recorded): its
    content blocks (text, image, audio, resource links, resources), its structuredContent
    when it had one, and isError; toolhub's record goes to `_meta["toolhub/invocation"]`,
    where a client still finds the invocation. None when the result is not that shape."""
    result = body.get("result")
    if not record.tool_ref.startswith("mcp__") or not isinstance(result, dict):
        return None
    content = result.get("content")
    if not isinstance(content, list):
        return None
    record_body = {key: value for key, value in body.items() if key != "result"}
    passed: dict[str, Any] = {
        "content": content,
        "isError": bool(result.get("isError", False)),
        "_meta": {"toolhub/invocation": record_body},
    }
    if isinstance(result.get("structuredContent"), dict):
        passed["structuredContent"] = result["structuredContent"]
    return passed


def _result(text: str, body: dict[str, Any], *, is_error: bool) -> dict[str, Any]:
    return {
        "content": [{"type": "text", "text": text}],
        "structuredContent": body,
        "isError": is_error,
    }
