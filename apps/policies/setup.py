"""Letting a principal use a tool, in one step, and explaining what it may use and why.

A call passes four independent gates (runner steps 2-4): a policy that allows the tool,
`execute_tool` for the caller's service user, and for tools that take a connection a grant
and `use_connection` on it. Setting those up by hand took five admin pages; `grant_tool`
does all of them, idempotently, and `access_of` reads them back for one principal.

What `grant_tool` creates is always the principal's own: a policy named
"setup: <principal>" that applies to that principal only, permissions for its service user,
a grant naming it. Nothing shared (a group, a tenant-wide policy) is widened.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from django.contrib.auth.models import User
from django.db import transaction
from guardian.shortcuts import assign_perm

from apps.connections.models import Connection, Grant
from apps.connections.permissions import USE, can_use_connection
from apps.policies import policy
from apps.policies.models import Outcome, Policy, PolicyRule
from apps.tenants import principals
from apps.tenants.models import ApiKey, Tenant
from apps.tenants.principals import UnmappablePrincipal, service_user
from apps.tools.models import Tool
from apps.tools.permissions import EXECUTE, can_execute

SETUP_POLICY_PREFIX = "setup: "


class SetupError(Exception):
    """The request cannot be set up as asked (e.g. a connection of another tenant)."""


@dataclass(frozen=True)
class Step:
    """One gate: what it is, whether this run created it or found it, and a note."""

    gate: str
    created: bool
    detail: str


@dataclass
class SetupReport:
    steps: list[Step] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def add(self, gate: str, created: bool, detail: str) -> None:
        self.steps.append(Step(gate, created, detail))

    @property
    def changed(self) -> bool:
        return any(step.created for step in self.steps)


def setup_policy_name(principal: str) -> str:
    return f"{SETUP_POLICY_PREFIX}{principal}"[:200]


def approval_rule_description(tool: Tool) -> str:
    return f"setup: every call of {tool.id} waits for a human"


@transaction.atomic
def grant_tool(
    tenant: Tenant,
    principal: str,
    tool: Tool,
    connection: Connection | None = None,
    *,
    approval: bool = False,
) -> SetupReport:
    """Let `principal` of `tenant` call `tool` (through `connection`), held or not.

    Idempotent: running it again changes nothing and says that everything exists.
    `approval=False` removes an approval rule an earlier setup added, but cannot lift
    approval another policy demands; the report warns when one does.
    """
    if connection is not None and connection.tenant_id != tenant.pk:
        raise SetupError("The connection belongs to another tenant.")
    if tool.requires_connection and connection is None:
        raise SetupError(f"{tool.id} needs a connection: choose one.")
    report = SetupReport()
    _allow_in_policy(report, tenant, principal, tool, approval)
    try:
        user = service_user(tenant, principal)
    except UnmappablePrincipal as exc:
        raise SetupError(exc.messages[0]) from None
    _permit_execution(report, user, tool)
    if connection is not None and tool.requires_connection:
        _grant_connection(report, tenant, principal, user, connection)
    elif connection is not None:
        report.warnings.append(f"{tool.id} takes no connection; none was granted.")
    if not tool.usable:
        report.warnings.append(
            f"{tool.id} is disabled or no longer provided: a superuser must enable it "
            "before any call is allowed."
        )
    decision = policy.Evaluator(tenant, principal, user).decide(tool)
    if not approval and decision.requires_approval:
        report.warnings.append(f"Calls will still be held: {decision.reason}")
    if tool.requires_confirmation:
        report.warnings.append(
            f"{tool.id} asks for confirmation of every call, whatever the policy."
        )
    return report


def _allow_in_policy(
    report: SetupReport, tenant: Tenant, principal: str, tool: Tool, approval: bool
) -> None:
    name = setup_policy_name(principal)
    own, created = Policy.objects.get_or_create(
        tenant=tenant,
        name=name,
        defaults={
            "principal": principal,
            "description": f"Tools set up for {principal} on the setup page.",
        },
    )
    if created:
        report.add("policy", True, f"Created policy {name!r} for {principal} only.")
    if not own.enabled:
        own.enabled = True
        own.save(update_fields=["enabled", "updated_at"])
        report.add("policy", True, f"Re-enabled policy {name!r}.")
    if own.tools.filter(pk=tool.pk).exists():
        report.add("policy", False, f"Policy {name!r} already allows {tool.id}.")
    else:
        own.tools.add(tool)
        report.add("policy", True, f"Policy {name!r} now allows {tool.id}.")
    rule = own.rules.filter(
        tool_pattern=tool.id, outcome=Outcome.REQUIRE_APPROVAL, condition="true"
    ).first()
    if approval and rule is None:
        PolicyRule.objects.create(
            policy=own,
            tool_pattern=tool.id,
            condition="true",
            outcome=Outcome.REQUIRE_APPROVAL,
            description=approval_rule_description(tool),
        )
        report.add("approval", True, f"Every call of {tool.id} by {principal} waits for a human.")
    elif approval:
        report.add("approval", False, f"Calls of {tool.id} already wait for a human.")
    elif rule is not None:
        rule.delete()
        report.add("approval", True, f"Removed the setup rule holding calls of {tool.id}.")


def _permit_execution(report: SetupReport, user: User, tool: Tool) -> None:
    if can_execute(user, tool):
        report.add("execute_tool", False, f"{user.username} may already execute {tool.id}.")
        return
    assign_perm(EXECUTE, user, tool)
    report.add("execute_tool", True, f"Gave {user.username} execute_tool on {tool.id}.")


def _grant_connection(
    report: SetupReport, tenant: Tenant, principal: str, user: User, connection: Connection
) -> None:
    standing = Grant.objects.active().filter(
        tenant=tenant, connection=connection, principal=principal, run_id=""
    )
    if standing.exists():
        report.add("grant", False, f"{principal} already holds a grant on {connection.name}.")
    else:
        Grant.objects.create(tenant=tenant, connection=connection, principal=principal)
        report.add("grant", True, f"Granted {connection.name} to {principal}.")
    if can_use_connection(user, connection):
        report.add("use_connection", False, f"{user.username} may already use {connection.name}.")
    else:
        assign_perm(USE, user, connection)
        report.add(
            "use_connection", True, f"Gave {user.username} use_connection on {connection.name}."
        )


# ---------------------------------------------------------------- reading it back


def known_principals(tenant: Tenant) -> list[str]:
    """Principals the tenant has issued keys to, granted, or written a policy for."""
    names = set(ApiKey.objects.filter(tenant=tenant).values_list("principal", flat=True))
    names |= set(
        Grant.objects.filter(tenant=tenant)
        .exclude(principal="")
        .values_list("principal", flat=True)
    )
    names |= set(
        Policy.objects.filter(tenant=tenant)
        .exclude(principal="")
        .values_list("principal", flat=True)
    )
    return sorted(names)


def existing_service_user(tenant: Tenant, principal: str) -> User | None:
    """The principal's service user, without creating one (reading never writes); None
    when its name is held by a user that is not its service user."""
    try:
        return principals.existing_service_user(tenant, principal)
    except principals.UnmappablePrincipal:
        return None


@dataclass(frozen=True)
class ToolAccess:
    tool: Tool
    decision: policy.Decision
    may_execute: bool
    rules: list[PolicyRule]  # judged per call, on its arguments: may deny or hold it

    @property
    def usable(self) -> bool:
        return self.decision.allowed and self.may_execute and self.tool.usable


@dataclass(frozen=True)
class ConnectionAccess:
    connection: Connection
    grants: list[Grant]
    may_use: bool

    @property
    def usable(self) -> bool:
        return bool(self.grants) and self.may_use


@dataclass
class Access:
    tenant: Tenant
    principal: str
    user: User | None
    tools: list[ToolAccess]
    connections: list[ConnectionAccess]


def access_of(tenant: Tenant, principal: str) -> Access:
    """Every tool a policy lets the principal see, and every connection granted to it,
    each with the gates it passes; the page per principal shows this."""
    user = existing_service_user(tenant, principal)
    evaluator = policy.Evaluator(tenant, principal, user)
    tools = []
    for tool in Tool.objects.filter(available=True).order_by("pk"):
        decision = evaluator.decide(tool)
        if decision.allowed:
            may = user is not None and can_execute(user, tool)
            rules = [
                r for p in evaluator.policies for r in evaluator.rules_of[p.pk] if r.matches(tool)
            ]
            tools.append(ToolAccess(tool, decision, may, rules))
    grants = list(
        Grant.objects.active()
        .filter(tenant=tenant, principal=principal)
        .select_related("connection")
        .order_by("connection__name", "pk")
    )
    by_connection: dict[Connection, list[Grant]] = {}
    for grant in grants:
        by_connection.setdefault(grant.connection, []).append(grant)
    connections = [
        ConnectionAccess(c, g, user is not None and can_use_connection(user, c))
        for c, g in by_connection.items()
    ]
    return Access(tenant, principal, user, tools, connections)
