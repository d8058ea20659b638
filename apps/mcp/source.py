"""Imported MCP tools as a tool source (TOOLHUB_TOOL_SOURCES): contracts built from rows.

Each imported tool becomes a ToolContract like a built-in one and passes the same
check (apps/tools/registry.py `check_contract`): its declared JSON Schema compiled to a
validator behind a pydantic model (apps/mcp/schemas.py), a redaction allowlist, an effect
chosen by an admin. The runner validates,
holds, times out, redacts and records it exactly as it does a built-in tool; the
contract's execute function forwards the validated arguments, exactly as the agent sent
them, to the server's pooled session, under the runner's deadline.
"""

from __future__ import annotations

import logging
import math
from typing import Any, ClassVar
from urllib.parse import urlsplit

from apps.connections.broker import note_sent, sent_scrubber, unseal
from apps.connections.netguard import host_allowed
from apps.invocations.requests import ProgressSink, progress_sink
from apps.mcp.models import (
    CommandNotAllowed,
    McpServer,
    McpServerCredential,
    McpTool,
    Transport,
    allowed_argv,
)
from apps.mcp.schemas import compile_params, declared_names
from apps.mcp.sessions import (
    AnswerTooLarge,
    CallCancelled,
    Endpoint,
    RemoteError,
    ServerBusy,
    ServerTimeout,
    ServerUnavailable,
    pool,
)
from apps.tenants.models import Tenant
from apps.tools.capabilities import Capabilities
from apps.tools.contracts import (
    Execute,
    Redaction,
    ToolCancelled,
    ToolContext,
    ToolContract,
    ToolError,
    ToolOutput,
    ToolParams,
    ToolRateLimited,
    ToolResultTooLarge,
    ToolTimedOut,
    ToolUnavailable,
)
from apps.tools.registry import RegisteredTool, check_contract
from apps.tools.schema import SchemaError
from toolhub.web import json_input

logger = logging.getLogger(__name__)
RESULT_FIELDS = ("content", "structuredContent", "isError")
MAX_DESCRIPTION = 200


class McpResult(ToolOutput):
    """A CallToolResult as toolhub returns it: content blocks and structured content.

    All of it is kept by redaction (RESULT_FIELDS): what the model needs is the whole
    answer; output limits (32 KB) apply as to every tool.
    """

    content: list[dict[str, Any]]
    structuredContent: dict[str, Any] | None = None
    isError: bool = False
    # "<server>/<tool>", which a failure's message names: set on each tool's own subclass.
    origin: ClassVar[str] = ""

    @classmethod
    def reported_failure(cls, dumped: dict[str, Any]) -> str | None:
        """The message of a result the server marked `isError` (None when it did not): the
        runner records the call as failed (`execution`, this message), and keeps the
        blocks, which toolhub's /mcp/ answers with (`isError: true`)."""
        if not dumped.get("isError"):
            return None
        texts = [
            block["text"]
            for block in dumped.get("content") or []
            if isinstance(block, dict) and block.get("type") == "text"
            if isinstance(block.get("text"), str) and block["text"]
        ]
        return f"{cls.origin}: {' '.join(texts) or 'The tool reported an error.'}"

    def counted_bytes(self, dumped: dict[str, Any]) -> int:
        """A text block that is the JSON of structuredContent counts once: FastMCP-style
        servers repeat their structured output as text for older clients, and the same
        answer should not meet the limit at half the size of another's."""
        structured = dumped.get("structuredContent")
        if structured is None:
            return super().counted_bytes(dumped)
        content = [
            {**block, "text": ""} if _repeats(block, structured) else block
            for block in dumped.get("content") or []
        ]
        return super().counted_bytes({**dumped, "content": content})


def _repeats(block: Any, structured: dict[str, Any]) -> bool:
    """Whether a content block is a text block holding exactly `structured` as JSON."""
    if not isinstance(block, dict) or block.get("type") != "text":
        return False
    text = block.get("text")
    if not isinstance(text, str) or not text.lstrip().startswith("{"):
        return False
    try:  # a server's text: read with the limits of JSON from outside (depth, size)
        return bool(json_input.loads(text) == structured)
    except json_input.JsonInputError:
        return False


def short_description(description: str) -> str:
    text = " ".join(description.split()) or "(no description)"
    return text if len(text) <= MAX_DESCRIPTION else text[: MAX_DESCRIPTION - 1] + "…"


def build_contract(row: McpTool) -> RegisteredTool:
    """The checked contract for an imported tool; raises SchemaError/ToolRegistrationError."""
    server = row.server
    try:
        params = compile_params(row.input_schema, title=f"{row.tool_id}_args")
    except SchemaError as exc:
        raise SchemaError(
            f"the input schema of {row.remote_name!r} cannot be used: {exc}"
        ) from None
    assert params.declared_schema is not None
    declared = declared_names(params.declared_schema)
    kept = [name for name in (row.redaction_args or declared) if name in declared]
    result = _result_model(f"{server.name}/{row.remote_name}")
    contract = ToolContract(
        name=row.tool_id.removeprefix("mcp__"),
        namespace="mcp",
        description=short_description(row.description),
        params=params,
        result=result,
        execute=_executor(server.pk, row.remote_name, result),
        effect=row.effect,  # type: ignore[arg-type]
        consequence_level=row.consequence_level,  # type: ignore[arg-type]
        requires_confirmation=row.requires_confirmation,
        timeout_s=min(600.0, max(0.1, server.timeout_ms / 1000)),
        redaction=Redaction(result=RESULT_FIELDS, args=tuple(kept)),
        tags=("mcp", server.name),
        version=row.accepted_hash[:16],
    )
    return check_contract(contract)


def _result_model(origin: str) -> type[McpResult]:
    """McpResult naming its tool in a failure's message (built once per contract)."""
    namespace = {"__module__": __name__, "__annotations__": {"origin": ClassVar[str]}}
    return type("McpResult", (McpResult,), {**namespace, "origin": origin})


class McpSource:
    """Provides `mcp__<server>__<tool>` ids for usable imported tools of enabled servers."""

    def __init__(self) -> None:
        self._cache: dict[str, tuple[tuple[Any, ...], RegisteredTool]] = {}

    def get(self, tool_id: str) -> RegisteredTool | None:
        if not tool_id.startswith("mcp__"):
            return None
        row = McpTool.objects.select_related("server").filter(tool_id=tool_id).first()
        if row is None or row.unusable_reason or not row.server.enabled:
            return None
        version = (
            row.accepted_hash,
            row.effect,
            row.consequence_level,
            row.requires_confirmation,
            tuple(row.redaction_args or ()),
            row.server.timeout_ms,
            row.server.pk,
        )
        cached = self._cache.get(tool_id)
        if cached is not None and cached[0] == version:
            return cached[1]
        try:
            registered = build_contract(row)
        except Exception:
            return None  # sync recorded the reason; the runner answers unavailable
        self._cache[tool_id] = (version, registered)
        return registered


def endpoint_for(
    server: McpServer, tenant: Tenant | None, call: ToolContext | object | None = None
) -> Endpoint:
    """How to reach `server` for `tenant`: the command re-checked against the allowlist,
    an HTTP server's headers from the tenant's credential connection (via the broker's
    header rules), never from arguments. For a `call`, the credential is noted as sent
    before it leaves (broker.note_sent): the runner scrubs it from the call's output and
    error messages (step 10b), as it does a connection's; discovery passes its listing
    instead, and scrubs what the server declares. A stdio server gets no
    credential: its argv only, and the SDK's default environment (PATH, HOME, ...)."""
    if server.transport == Transport.STDIO:
        try:
            argv = allowed_argv(server.command)
        except CommandNotAllowed as exc:
            # The reason names the deployment's allowlist: for the log, never the agent.
            logger.warning("MCP server %s may not run: %s", server.name, exc)
            raise ToolUnavailable(
                f"The MCP server {server.name} is not allowed to run on this deployment; "
                "an administrator must allow its program."
            ) from None
        return Endpoint(server=server.name, argv=tuple(argv))
    headers: dict[str, str] = {}
    credential = (
        McpServerCredential.objects.select_related("connection")
        .filter(server=server, tenant=tenant)
        .first()
        if tenant is not None
        else None
    )
    if credential is not None:
        connection = credential.connection
        # A credential goes only where its connection may send it, as for http_request.
        host = urlsplit(server.url).hostname or ""
        if not host_allowed(host.lower(), list(connection.allowed_hosts or [])):
            # The server's host is the deployment's configuration: not in the message.
            raise ToolUnavailable(
                f"The connection {connection.name!r} may not send its credentials to the "
                f"MCP server {server.name} (its host is not in the connection's allowed "
                "hosts); a tenant admin must add it."
            )
        # Decrypted once per secret version, as for http_request (broker.unseal): a
        # rotated or re-encrypted secret is a new ciphertext, so the next call reads it.
        unsealed = unseal(str(connection.pk), connection.kind, connection.secret_encrypted)
        if call is not None:
            note_sent(call, unsealed)
        headers = unsealed.credentials()
    return Endpoint(
        server=server.name,
        url=server.url,
        headers=tuple(sorted(headers.items())),
        tenant=tenant.slug if credential is not None and tenant is not None else "",
        allow_private=server.allow_private_network,
    )


def _executor(
    server_pk: int, remote_name: str, result_model: type[McpResult] = McpResult
) -> Execute:
    def execute_remote(params: ToolParams, ctx: ToolContext, caps: Capabilities) -> McpResult:
        server = McpServer.objects.filter(pk=server_pk, enabled=True).first()
        if server is None:
            raise ToolUnavailable("The MCP server is disabled or was removed.")
        tenant = Tenant.objects.filter(slug=ctx.tenant).first()
        endpoint = endpoint_for(server, tenant, call=ctx)
        try:
            result = pool.call_tool(
                endpoint,
                remote_name,
                params.model_dump(mode="json"),
                timeout=max(0.05, ctx.time_left()),
                cancelled=lambda: ctx.cancelled,
                on_progress=_forwarded(progress_sink.get(), ctx),
            )
        except ServerUnavailable as exc:
            raise ToolUnavailable(
                f"The MCP server {server.name} is unavailable: {exc.for_agent}."
            ) from None
        except ServerTimeout:
            raise ToolTimedOut(f"The MCP server {server.name} did not answer in time.") from None
        except CallCancelled:
            raise ToolCancelled() from None
        except ServerBusy as exc:
            # 429: rate_limited; 503 or an error hinting retryAfterMs: unavailable. The
            # hint (Retry-After, capped) becomes the call's retryAfterMs.
            busy = ToolRateLimited if exc.status == 429 else ToolUnavailable
            raise busy(
                f"The MCP server {server.name} is busy: {exc}"[:1000], exc.retry_after_ms
            ) from None
        except AnswerTooLarge as exc:
            raise ToolResultTooLarge(f"{server.name}/{remote_name}: {exc}.") from None
        except RemoteError as exc:
            raise ToolError(f"{server.name}/{remote_name}: {exc}"[:1000]) from None
        content = [
            block.model_dump(mode="json", by_alias=True, exclude_none=True)
            for block in result.content
        ]
        # isError: the runner records a failure and keeps the blocks (reported_failure).
        return result_model(
            content=content,
            structuredContent=result.structured_content,
            isError=bool(result.is_error),
        )

    return execute_remote


MAX_PROGRESS_MESSAGE = 1000


def _forwarded(sink: ProgressSink | None, ctx: ToolContext) -> ProgressSink | None:
    """The caller's progress sink, fed what the server reports as step 10b feeds the
    result: a message cut to 1,000 characters with the credential sent scrubbed from it,
    numbers only when finite (a JSON answer has no NaN)."""
    if sink is None:
        return None
    scrubber = sent_scrubber(ctx)

    def report(progress: float, total: float | None, message: str | None) -> None:
        if not math.isfinite(progress) or (total is not None and not math.isfinite(total)):
            return
        if message is not None:
            message = message[:MAX_PROGRESS_MESSAGE]
            message = scrubber.text(message) if scrubber is not None else message
        sink(progress, total, message)

    return report
