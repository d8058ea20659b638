"""The catalog as the API sends it, encoded once per authorization epoch.

With 10,000 tools the catalog's JSON is megabytes: building each tool's entry and
encoding them took about 300 ms a request (issue 45), though the list only changes with
the epoch. The encoded body is kept beside the catalog itself (apps.policies.policy), per
caller and format, and dropped with it when anything the catalog reads changes.
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

    from apps.tenants.models import Tenant
    from apps.tools.models import Tool

FORMATS: dict[str, Callable[[Tool], dict[str, Any]] | None] = {
    "": None,
    "toolhub": None,
    "openai": openai_tool,
    "anthropic": anthropic_tool,
}

_BODIES = EpochCache("catalog bodies")


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
    encode = FORMATS[wire_format]
    tools = [encode(tool) if encode else tool_spec(tool, d) for tool, d in allowed]
    body: dict[str, object] = {"tools": tools}
    if not tools and run is not None:
        body["notice"] = (
            f"No tool on the allowlist of run {run[0]} is available to {principal} now: "
            "each was disabled or is no longer allowed by a policy."
        )
    elif not tools:
        # Never a silent empty list: say why, so nobody runs a model tool-less by accident.
        body["notice"] = (
            f"No tool is available to {principal} in tenant {tenant.slug}: "
            "no enabled policy allows an enabled tool that this principal may execute "
            "(execute_tool permission)."
        )
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
