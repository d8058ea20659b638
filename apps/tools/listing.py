"""The catalog as the API sends it, encoded once per catalog.

With 10,000 tools the catalog's JSON is megabytes: building each tool's entry and
encoding them took about 300 ms a request (issue 45), though the list only changes with
what it is made of. The encoded body is kept on the catalog itself (a `Catalog` of
apps.policies.policy, one object while its evaluator, tool rows and grants are the same),
per format and run, so an authorization change that changed none of them encodes nothing.

Below the body, each tool's entry is kept encoded on the tool's row (one object per
version of the tool: apps/tools/rows.py reloads a written tool's row), per format and
the one thing a decision adds to it (requiresApproval): a new body is a join of these,
and only a tool written since is encoded again.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from apps.policies.policy import catalog, drop
from apps.tenants.epoch import EpochCache
from apps.tools.wire import anthropic_tool, openai_tool, tool_spec

if TYPE_CHECKING:
    from django.contrib.auth.models import User

    from apps.policies.policy import Catalog, Decision
    from apps.tenants.models import Tenant
    from apps.tools.models import Tool

FORMATS: dict[str, Callable[[Tool], dict[str, Any]] | None] = {
    "": None,
    "toolhub": None,
    "openai": openai_tool,
    "anthropic": anthropic_tool,
}

_BODIES = EpochCache("catalog bodies")
MAX_BODIES = 64  # kept per catalog (formats by runs); past it they start over


def catalog_body(
    tenant: Tenant,
    principal: str,
    user: User,
    wire_format: str,
    run: tuple[str, frozenset[str]] | None = None,
) -> bytes:
    """The JSON body of GET /api/v1/tools/ (DRF's JSONRenderer's encoding: UTF-8, compact);
    for a `run` started with an allowlist (its id and tools), only the tools on it."""
    key = (tenant.pk, principal, user.pk, user.is_active, user.is_superuser, wire_format, run)
    return _BODIES.get(key, lambda: _encode(tenant, principal, user, wire_format, run))


def _encode(
    tenant: Tenant,
    principal: str,
    user: User,
    wire_format: str,
    run: tuple[str, frozenset[str]] | None,
) -> bytes:
    allowed = catalog(tenant, principal, user)
    key = (wire_format, run, tenant.slug, principal)
    body = allowed.bodies.get(key)
    if body is None:
        body = _body(allowed, tenant, principal, wire_format, run)
        if len(allowed.bodies) >= MAX_BODIES:
            allowed.bodies.clear()
        allowed.bodies[key] = body
    return body


def _body(
    allowed: Catalog,
    tenant: Tenant,
    principal: str,
    wire_format: str,
    run: tuple[str, frozenset[str]] | None,
) -> bytes:
    if run is not None:
        on_run = [(tool, d) for tool, d in allowed if tool.pk in run[1]]
        if on_run:
            return _joined([_entry(tool, d, wire_format) for tool, d in on_run])
    elif allowed.source is not None and allowed:
        # Narrowed to the caller's grants: the entries of the catalog it was narrowed
        # from (kept across grant edits), less those of the tools it left out.
        source = allowed.source
        return _joined(drop(_entries(source, wire_format), source.positions, allowed.missing))
    elif allowed:
        return _joined(_entries(allowed, wire_format))
    body: dict[str, object] = {"tools": []}
    if run is not None:
        body["notice"] = (
            f"No tool on the allowlist of run {run[0]} is available to {principal} now: "
            "each was disabled or is no longer allowed by a policy."
        )
    else:
        # Never a silent empty list: say why, so nobody runs a model tool-less by accident.
        body["notice"] = (
            f"No tool is available to {principal} in tenant {tenant.slug}: "
            "no enabled policy allows an enabled tool that this principal may execute "
            "(execute_tool permission)."
        )
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()


def _joined(entries: list[bytes]) -> bytes:
    return b'{"tools":[' + b",".join(entries) + b"]}"


def _entries(allowed: Catalog, wire_format: str) -> list[bytes]:
    """The catalog's entries, in its order, kept on it per format."""
    found = allowed.entries.get(wire_format)
    if found is None:
        before = allowed.entries_before.get(wire_format)
        if before is not None:  # patched from a catalog encoded already: its places changed
            found = list(before)
            for at in allowed.replaced:
                found[at] = _entry(*allowed[at], wire_format)
        else:
            found = [_entry(t, d, wire_format) for t, d in allowed]
        allowed.entries[wire_format] = found
    return found


def _entry(tool: Tool, decision: Decision, wire_format: str) -> bytes:
    """One tool's entry, encoded as the body encodes it (UTF-8, compact), kept on the
    tool's row (a row of rows.usable(): a written tool is a new row)."""
    approval = tool.requires_confirmation or decision.outcome == "require_approval"
    kept: dict[tuple[str, bool], bytes] | None = tool.__dict__.get(_KEPT)
    if kept is None:
        kept = tool.__dict__.setdefault(_KEPT, {})
    found = kept.get((wire_format, approval))
    if found is None:
        encode = FORMATS[wire_format]
        entry = encode(tool) if encode else tool_spec(tool, decision)
        found = json.dumps(entry, ensure_ascii=False, separators=(",", ":")).encode()
        kept[wire_format, approval] = found
    return found


_KEPT = "_toolhub_entries"  # the attribute of a tool row its encoded entries are kept in
