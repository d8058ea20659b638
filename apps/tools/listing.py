"""The catalog as the API sends it, encoded once per authorization epoch.

With 10,000 tools the catalog's JSON is megabytes: building each tool's entry and
encoding them took about 300 ms a request (issue 45), though the list only changes with
the epoch. The encoded body is kept beside the catalog itself (apps.policies.policy), per
caller and format, and dropped with it when anything the catalog reads changes.

Below the body, each tool's entry is kept encoded per process by the tool's id and
`updated_at` (every write of a tool stamps it: apps/tools/rows.py), its format and the
one thing a decision adds to it (requiresApproval): after an authorization change the
body is a join of these, and only a tool written since is encoded again.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from apps.policies.policy import catalog
from apps.tenants.epoch import EpochCache
from apps.tools.wire import anthropic_tool, openai_tool, tool_spec

if TYPE_CHECKING:
    from django.contrib.auth.models import User

    from apps.policies.policy import Decision
    from apps.tenants.models import Tenant
    from apps.tools.models import Tool

FORMATS: dict[str, Callable[[Tool], dict[str, Any]] | None] = {
    "": None,
    "toolhub": None,
    "openai": openai_tool,
    "anthropic": anthropic_tool,
}

_BODIES = EpochCache("catalog bodies")
# Encoded entries by (tool id, updated_at, format, requiresApproval); started over past
# MAX_ENTRIES (entries of tools edited since linger until then: never looked up again).
_ENTRIES: dict[tuple[Any, ...], bytes] = {}
MAX_ENTRIES = 50_000


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
    if run is not None:
        allowed = [(tool, d) for tool, d in allowed if tool.pk in run[1]]
    if allowed:
        entries = b",".join(_entry(tool, d, wire_format) for tool, d in allowed)
        return b'{"tools":[' + entries + b"]}"
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


def _entry(tool: Tool, decision: Decision, wire_format: str) -> bytes:
    """One tool's entry, encoded as the body encodes it (UTF-8, compact)."""
    approval = tool.requires_confirmation or decision.outcome == "require_approval"
    key = (tool.id, tool.updated_at, wire_format, approval)
    found = _ENTRIES.get(key)
    if found is None:
        encode = FORMATS[wire_format]
        entry = encode(tool) if encode else tool_spec(tool, decision)
        found = json.dumps(entry, ensure_ascii=False, separators=(",", ":")).encode()
        if len(_ENTRIES) >= MAX_ENTRIES:
            _ENTRIES.clear()
        _ENTRIES[key] = found
    return found
