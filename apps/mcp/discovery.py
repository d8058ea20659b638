"""Importing a server's tools into the catalog (mcp_sync, the admin action, list_changed).

Nothing is ever enabled here: a new tool starts disabled and untrusted (effect
external_side_effect, whatever its annotations claim); a tool whose description or
schema changed is disabled until an admin accepts the change (tool poisoning); a
tool whose schema cannot be used (apps/mcp/schemas.py: it does not compile, fetches
something, declares `connectionId`...) is imported unusable with a reason naming it, and
the rest of the sync goes on.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.db import transaction
from django.utils import timezone

from apps.connections.broker import sent_scrubber
from apps.connections.scrubbing import Scrubber
from apps.mcp.models import McpServer, McpTool, Transport, tool_hash
from apps.mcp.sessions import Endpoint, RemoteError, ServerTimeout, ServerUnavailable, pool
from apps.mcp.source import build_contract, endpoint_for, short_description
from apps.tenants.models import Tenant
from apps.tools.contracts import ToolError
from apps.tools.models import Source, Tool

logger = logging.getLogger(__name__)
ID_RE = re.compile(r"^[a-z0-9_]{1,64}$")


class SyncFailed(Exception):
    """The server could not be listed at all (down, hanging, not MCP)."""


class CredentialChoice(SyncFailed):
    """Whose credential lists the server's tools is unknown or ambiguous: nothing was asked."""


@dataclass
class SyncReport:
    server: str
    created: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    gone: list[str] = field(default_factory=list)
    unusable: dict[str, str] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    tenant: str = ""  # whose credential listed the tools ("" for none)


HASH_CHARS = 8


def normalise(remote_name: str) -> str:
    """A remote tool name as the last part of an id: lower case, [a-z0-9_] only."""
    return re.sub(r"[^a-z0-9_]", "_", remote_name.lower())


def tool_id_for(server: McpServer, remote_name: str) -> str | None:
    """The plain id of a remote name (`mcp__<server>__<normalised name>`), or None when
    that is no valid id (longer than 64 characters, or nothing but underscores)."""
    tool_id = server.tool_prefix + normalise(remote_name)
    return tool_id if ID_RE.fullmatch(tool_id) and normalise(remote_name).strip("_") else None


def hashed_id(server: McpServer, remote_name: str) -> str:
    """The id of a remote name that has no plain one, or shares it: the normalised name cut
    to fit, then `_` and 8 hex characters of the name's SHA-256. Deterministic, and
    distinct for distinct names (2^32 values per server; a clash is reported, never merged)."""
    room = 64 - len(server.tool_prefix) - 1 - HASH_CHARS
    stem = normalise(remote_name).strip("_")[:room].rstrip("_") or "tool"
    digest = hashlib.sha256(remote_name.encode()).hexdigest()[:HASH_CHARS]
    return f"{server.tool_prefix}{stem}_{digest}"


def assign_ids(server: McpServer, names: list[str]) -> dict[str, str]:
    """The id of each remote name of one listing, every one `^[a-z0-9_]{1,64}$`.

    A name keeps its plain id when it is already in the id alphabet (`get_time`), or when
    no other name of the listing normalises to the same id (`Get-Time` alone is
    `get_time`); the others (`Get-Time` beside `get_time`, a name too long, one of symbols
    only) get their hashed id. The upstream name is kept (McpTool.remote_name) for calls.
    An id once imported stays with its name (_import_one), whatever later listings hold.
    """
    plain = {name: tool_id_for(server, name) for name in names}
    claims: dict[str, list[str]] = {}
    for name, tool_id in plain.items():
        if tool_id is not None:
            claims.setdefault(tool_id, []).append(name)
    ids = {}
    for name, tool_id in plain.items():
        if tool_id is not None and (
            tool_id == server.tool_prefix + name or len(claims[tool_id]) == 1
        ):
            ids[name] = tool_id
        else:
            ids[name] = hashed_id(server, name)
    return ids


def listing_tenant(
    server: McpServer, slug: str | None, progress: Callable[[str], None] = lambda line: None
) -> Tenant | None:
    """Whose credential lists an HTTP server's tools: the named tenant's, else the only one.

    A server may refuse even tools/list without credentials, and credentials are only ever
    a tenant's (a connection, through the broker's header rules). With several tenants'
    credentials and none named, picking one would be a guess: refused.
    """
    if server.transport != Transport.HTTP:
        if slug is not None:
            raise CredentialChoice(f"{server.name} runs over stdio: it takes no credentials")
        return None
    credentials = server.credentials.select_related("tenant").order_by("tenant__slug")
    if slug is not None:
        credential = credentials.filter(tenant__slug=slug).first()
        if credential is None:
            known = Tenant.objects.filter(slug=slug).exists()
            raise CredentialChoice(
                f"tenant {slug!r} has no credential for {server.name} (add one on the "
                "server's admin page)"
                if known
                else f"no tenant {slug!r}"
            )
        progress(f"{server.name}: listing with the credential of tenant {slug}")
        return credential.tenant
    found = list(credentials[:6])
    if not found:
        return None
    if len(found) > 1:
        slugs = ", ".join(c.tenant.slug for c in found[:5]) + (", ..." if len(found) > 5 else "")
        raise CredentialChoice(
            f"{server.name} has credentials of several tenants ({slugs}); choose whose "
            f"lists its tools: manage.py mcp_sync {server.name} --tenant <slug>"
        )
    progress(f"{server.name}: listing with the only credential, tenant {found[0].tenant.slug}'s")
    return found[0].tenant


def sync_server(
    server: McpServer,
    progress: Callable[[str], None] = lambda line: None,
    tenant: str | None = None,
) -> SyncReport:
    """Import what `server` declares, listing with `tenant`'s credential (a slug) or, when
    none is named, as listing_tenant decides."""
    report = SyncReport(server=server.name)
    credential_tenant = listing_tenant(server, tenant, progress)
    report.tenant = credential_tenant.slug if credential_tenant is not None else ""
    progress(f"{server.name}: listing tools")
    # The credential sent for the listing is noted (as a call's is) so that whatever the
    # server answers is scrubbed of it before it becomes catalog text, which every
    # tenant's users, the model, the admin and the logs read.
    listing = _Listing()
    scrubber: Scrubber | None = None
    try:
        endpoint = endpoint_for(server, credential_tenant, call=listing)
        scrubber = sent_scrubber(listing)
        listed = pool.list_tools(endpoint, timeout=server.timeout_ms / 1000)
    except (ServerUnavailable, ServerTimeout, RemoteError, ToolError) as exc:
        reason = (
            f"no answer within {server.timeout_ms} ms"
            if isinstance(exc, ServerTimeout)
            else getattr(exc, "safe_message", None) or str(exc)
        )
        scrubber = scrubber or sent_scrubber(listing)
        if scrubber is not None:
            reason = scrubber.text(reason)
        server.last_error = f"listing failed: {reason}"[:2000]
        server.save(update_fields=["last_error"])
        raise SyncFailed(server.last_error) from None
    declared: dict[str, Any] = {}
    for tool in listed:
        if scrubber is not None:
            if scrubber.text(tool.name) != tool.name:
                report.errors.append(
                    "a tool whose name contains the listing credential is not imported"
                )
                continue
            if _keys_leak(scrubber, tool.input_schema):
                report.errors.append(
                    f"{tool.name[:80]!r} has a schema whose property names contain the "
                    "listing credential; not imported"
                )
                continue
            tool = _scrubbed(scrubber, tool)
        declared[tool.name] = tool
    by_id: dict[str, list[str]] = {}
    for name, tool_id in assign_ids(server, sorted(declared)).items():
        by_id.setdefault(tool_id, []).append(name)
    with transaction.atomic():
        for tool_id, names in sorted(by_id.items()):
            if len(names) > 1:
                report.errors.append(
                    f"{', '.join(repr(n) for n in sorted(names))} collide as {tool_id}; "
                    "none of them is imported"
                )
                continue
            _import_one(server, tool_id, declared[names[0]], report, progress)
        _mark_gone(server, set(declared), report)
        server.last_synced_at = timezone.now()
        server.last_error = "; ".join(report.errors)[:2000]
        server.save(update_fields=["last_synced_at", "last_error"])
    progress(
        f"{server.name}: {len(report.created)} new, {len(report.changed)} changed (disabled until "
        f"accepted), {len(report.unchanged)} unchanged, {len(report.gone)} gone, "
        f"{len(report.unusable)} unusable, {len(report.errors)} errors"
    )
    for error in report.errors:
        progress(f"{server.name}: error: {error}")
    return report


class _Listing:
    """Stands for the listing as a call's context does for a call: the key under which
    endpoint_for notes the credential it sends (broker.note_sent)."""


def _keys_leak(scrubber: Scrubber, value: Any) -> bool:
    """Whether a property name (a dict key anywhere in a schema) contains the credential:
    a key cannot be replaced without changing the tool's contract."""
    if isinstance(value, dict):
        return any(
            (isinstance(key, str) and scrubber.text(key) != key) or _keys_leak(scrubber, item)
            for key, item in value.items()
        )
    if isinstance(value, list | tuple):
        return any(_keys_leak(scrubber, item) for item in value)
    return False


def _scrubbed(scrubber: Scrubber, tool: Any) -> Any:
    """The declared tool with the credential replaced in its description, its schema's
    strings (titles, descriptions, defaults, enum values) and its annotations."""
    changes: dict[str, Any] = {}
    if tool.description:
        changes["description"] = scrubber.text(tool.description)
    if getattr(tool, "title", None):
        changes["title"] = scrubber.text(tool.title)
    if isinstance(tool.input_schema, dict):
        changes["input_schema"] = scrubber.scrub(tool.input_schema)
    if tool.annotations is not None:
        changes["annotations"] = type(tool.annotations).model_validate(
            scrubber.scrub(tool.annotations.model_dump(mode="json", by_alias=True))
        )
    return tool.model_copy(update=changes)


def _import_one(
    server: McpServer,
    tool_id: str,
    declared: Any,
    report: SyncReport,
    progress: Callable[[str], None],
) -> None:
    description = declared.description or ""
    schema = declared.input_schema if isinstance(declared.input_schema, dict) else {}
    annotations = (
        declared.annotations.model_dump(mode="json", by_alias=True, exclude_none=True)
        if declared.annotations is not None
        else {}
    )
    # The server's title for clients of /mcp/: the tool's `title`, which MCP shows before
    # `annotations.title`, is kept in the annotations (both are the server's words).
    title = getattr(declared, "title", None) or annotations.get("title")
    if title:
        annotations["title"] = title
    digest = tool_hash(description, schema)
    row = (
        McpTool.objects.select_related("tool")
        .filter(server=server, remote_name=declared.name)
        .first()
    )
    now = timezone.now()
    if row is not None:
        tool_id = row.tool_id  # an imported tool keeps its id (ids are stable)
    if row is None:
        if Tool.objects.filter(pk=tool_id).exists():
            # Held by a name imported before (`Get-Time` then, `get_time` now): the hashed id.
            tool_id = hashed_id(server, declared.name)
            if Tool.objects.filter(pk=tool_id).exists():
                report.errors.append(f"{tool_id} is already taken by another tool; not imported")
                return
        tool = Tool(id=tool_id, enabled=False, source=Source.MCP)
        row = McpTool(
            server=server,
            remote_name=declared.name,
            tool=tool,
            description=description,
            input_schema=schema,
            accepted_hash=digest,
        )
        report.created.append(tool_id)
        progress(f"{server.name}: new tool {tool_id} (disabled)")
    elif digest != row.accepted_hash:
        if tool_hash(row.pending_description, row.pending_input_schema or {}) != digest:
            row.pending_description, row.pending_input_schema = description, schema
            row.pending_since = now
        if row.tool.enabled:
            row.enabled_before_change = True
            row.tool.enabled = False
        report.changed.append(tool_id)
        progress(f"{server.name}: {tool_id} changed; disabled until an admin accepts it")
    else:
        if row.has_pending_change:  # the server went back to what was accepted
            row.pending_description, row.pending_input_schema, row.pending_since = "", None, None
            row.tool.enabled = row.tool.enabled or row.enabled_before_change
            row.enabled_before_change = False
        report.unchanged.append(tool_id)
    row.annotations = annotations
    row.seen_at = now
    apply_to_catalog(row)
    if row.unusable_reason:
        report.unusable[tool_id] = row.unusable_reason
        progress(f"{server.name}: {tool_id} is unusable: {row.unusable_reason}")


def apply_to_catalog(row: McpTool) -> None:
    """Compile the accepted version and mirror it into the tool's catalog row."""
    tool = row.tool
    try:
        registered = build_contract(row)
    except Exception as exc:
        row.unusable_reason = str(exc)[:1000] or type(exc).__name__
        tool.input_schema = row.input_schema if isinstance(row.input_schema, dict) else {}
        tool.output_schema = {}
        tool.schema_hash = ""
        tool.redaction_result, tool.redaction_args = [], []
    else:
        row.unusable_reason = ""
        tool.input_schema = registered.input_schema
        tool.output_schema = registered.output_schema
        tool.schema_hash = registered.schema_hash
        assert registered.contract.redaction is not None
        tool.redaction_result = list(registered.contract.redaction.result)
        tool.redaction_args = list(registered.contract.redaction.args)
    tool.name = row.tool_id.removeprefix("mcp__")[:64] if row.tool_id else tool.id[5:69]
    tool.description = short_description(row.description)
    tool.effect = row.effect
    tool.consequence_level = row.consequence_level
    tool.requires_confirmation = row.requires_confirmation
    tool.requires_connection = False
    tool.timeout_ms = row.server.timeout_ms
    tool.tags = ["mcp", row.server.name]
    tool.version = row.accepted_hash[:16]
    tool.source = Source.MCP
    tool.available = True
    tool.apply_call_settings()  # the effect's defaults, unless staff set them
    if row.unusable_reason:
        tool.enabled = False
    tool.save()
    row.tool = tool
    row.save()


def _mark_gone(server: McpServer, declared: set[str], report: SyncReport) -> None:
    for row in McpTool.objects.filter(server=server).exclude(remote_name__in=declared):
        Tool.objects.filter(pk=row.tool_id).update(available=False)
        report.gone.append(row.tool_id)


@transaction.atomic
def accept_change(row: McpTool) -> None:
    """An admin accepts what the server declares now; the tool is enabled again only if
    it was enabled before the change."""
    if not row.has_pending_change:
        return
    row.description = row.pending_description
    row.input_schema = row.pending_input_schema or {}
    row.accepted_hash = tool_hash(row.description, row.input_schema)
    row.pending_description, row.pending_input_schema, row.pending_since = "", None, None
    row.tool.enabled = row.enabled_before_change
    row.enabled_before_change = False
    apply_to_catalog(row)


def sync_on_list_changed(endpoint: Endpoint) -> None:
    """notifications/tools/list_changed: re-sync (which never enables anything), with the
    credential of the session that heard it."""
    from django.db import close_old_connections

    server_name = endpoint.server
    try:
        server = McpServer.objects.filter(name=server_name, enabled=True).first()
        if server is not None:
            sync_server(server, tenant=endpoint.tenant or None)
    except Exception as exc:
        logger.warning("re-sync of MCP server %s failed: %s", server_name, type(exc).__name__)
    finally:
        close_old_connections()
