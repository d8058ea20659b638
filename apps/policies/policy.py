"""The policy evaluator: one place that says allow, deny or require_approval.

DENY_BY_DEFAULT: a tool no enabled policy of the tenant lists is denied. The
catalog a caller sees and the runner's check both come from here, so what is
listed is what may run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from django.db.models import Prefetch

from apps.policies.models import Policy
from apps.tenants.models import Tenant
from apps.tools.models import Tool

Outcome = Literal["allow", "deny", "require_approval"]


@dataclass(frozen=True)
class Decision:
    outcome: Outcome
    rule: str  # which policy (or default) decided, recorded with the call
    reason: str

    @property
    def allowed(self) -> bool:
        return self.outcome != "deny"


def _allowed_by(policy: Policy) -> Decision:
    return Decision(
        "allow", f"policy:{policy.pk}:{policy.name}", f"Allowed by policy {policy.name!r}."
    )


def decide(tenant: Tenant, principal: str, tool: Tool) -> Decision:
    policy = Policy.objects.in_force(tenant).filter(tools=tool).order_by("pk").first()
    if policy is None:
        return Decision("deny", "default:deny", f"No policy of this tenant allows {tool.id}.")
    return _allowed_by(policy)


def allowed_tools(tenant: Tenant, principal: str) -> list[tuple[Tool, Decision]]:
    """The usable tools this caller may see, each with the decision that admits it."""
    usable = Prefetch("tools", queryset=Tool.objects.usable().order_by("pk"))
    found: dict[str, tuple[Tool, Decision]] = {}
    for policy in Policy.objects.in_force(tenant).order_by("pk").prefetch_related(usable):
        for tool in policy.tools.all():
            found.setdefault(tool.pk, (tool, _allowed_by(policy)))
    return [found[tool_id] for tool_id in sorted(found)]
