"""Two tenants' worth of rows in every admin-registered model, and a browser-like form reader."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from html.parser import HTMLParser
from typing import Any

from django.contrib import admin
from django.contrib.auth.models import Permission, User
from django.db.models import Model
from django.utils import timezone
from django_tasks_db.models import DBTaskResult
from guardian.shortcuts import assign_perm

from apps.approvals.models import ApprovalRequest, ApprovalWebhook, WebhookDelivery
from apps.connections.models import Connection, Grant
from apps.identity.models import ExternalIdentity, GroupMapping
from apps.invocations.models import InvocationRecord, RunEvent
from apps.mcp.models import McpServer, McpServerCredential, McpTool
from apps.oauth.models import TokenKey
from apps.planning.models import Plan, PlanStep
from apps.policies.models import Outcome, Policy, PolicyRule
from apps.retention.models import PruneMark, RetentionPolicy
from apps.tenants.models import ApiKey, Tenant
from apps.tenants.principals import agents_group
from apps.tenants.roles import Role, grant_role
from apps.tools.models import Tool

TOOL = "core__get_current_time"


def registered_models() -> list[type[Model]]:
    return list(admin.site._registry)


def snapshot() -> dict[type[Model], set[Any]]:
    return {m: set(m._default_manager.values_list("pk", flat=True)) for m in registered_models()}


@dataclass
class World:
    """Rows per registered model: `own` (tenant acme's), `foreign` (tenant globex's)."""

    staff: User
    superuser: User
    own: dict[type[Model], list[Any]] = field(default_factory=dict)
    foreign: dict[type[Model], list[Any]] = field(default_factory=dict)


def populate(slug: str) -> User:
    """Every kind of row a tenant has; every string of tenant `slug` contains the slug."""
    tenant = Tenant.objects.create(slug=slug, name=f"{slug} corp")
    member = User.objects.create_user(f"{slug}-member", is_staff=True)
    tenant.members.add(member)
    key, _ = ApiKey.objects.issue(tenant, f"agent:{slug}-bot", name=f"{slug} key")
    group = agents_group(tenant)
    connection = Connection(tenant=tenant, name=f"{slug}-crm", kind="bearer")
    connection.allowed_hosts = [f"api.{slug}.example"]
    connection.set_secret(token=f"{slug}-token")
    connection.save()
    Grant.objects.create(tenant=tenant, connection=connection, principal=key.principal)
    policy = Policy.objects.create(tenant=tenant, name=f"{slug} policy", group=group)
    PolicyRule.objects.create(
        policy=policy, condition="true", outcome=Outcome.ALLOW, description=f"{slug} rule"
    )
    tool = Tool.objects.get(pk=TOOL)
    policy.tools.add(tool)
    record = InvocationRecord.objects.create(
        tenant=tenant,
        tool=tool,
        tool_ref=TOOL,
        tool_call_id=f"{slug}-call",
        run_id=f"{slug}-run",
        principal=key.principal,
        status="pending_approval",
    )
    RunEvent.objects.create(
        tenant=tenant,
        run_id=f"{slug}-run",
        seq=1,
        type="tool_call_start",
        tool_call_id=f"{slug}-call",
        tool_id=TOOL,
        message={"runId": f"{slug}-run"},
        at=timezone.now(),
    )
    approval = ApprovalRequest.objects.create(
        tenant=tenant,
        invocation=record,
        tool=tool,
        principal=key.principal,
        requested_by=key.user,
        run_id=f"{slug}-run",
        tool_call_id=f"{slug}-call",
        args={},
        original_args={},
        bound_hash="0" * 64,
        hold_reason=f"{slug} needs a human",
        expires_at=timezone.now() + timedelta(hours=1),
    )
    hook = ApprovalWebhook.objects.create(
        tenant=tenant, name=f"{slug}-hook", url=f"https://hooks.{slug}.example/in"
    )
    WebhookDelivery.objects.create(
        approval=approval,
        tenant=tenant,
        webhook=hook,
        url=hook.url,
        format=hook.format,
        last_error=f"{slug} answered 500",
    )
    # The agent's key doubles as the key an issuer's tokens act through (one key per tenant
    # keeps the API-key pages' tests simple).
    TokenKey.objects.create(
        issuer=f"https://id.{slug}.example", tenant=tenant, principal=key.principal, key=key
    )
    RetentionPolicy.objects.create(tenant=tenant, days=400)
    PruneMark.objects.create(tenant=tenant, before=timezone.now(), pruned_at=timezone.now())
    plan = Plan.objects.create(tenant=tenant, run_id=f"{slug}-run", objective=f"{slug} plan")
    PlanStep.objects.create(plan=plan, step_id=1, title=f"{slug} step")
    # MCP servers belong to no tenant (superusers only); one per slug so the walker has rows.
    # The imported tool is in the global catalog, so its strings name no tenant.
    server = McpServer.objects.create(
        name=f"{slug}srv", transport="http", url=f"http://{slug}.example/mcp"
    )
    McpServerCredential.objects.create(server=server, tenant=tenant, connection=connection)
    number = McpServer.objects.count()
    imported = Tool.objects.get(pk=f"mcp__srv{number}__tool")  # made before the diff
    McpTool.objects.create(
        server=server, remote_name=f"{slug}-tool", tool=imported, accepted_hash="0"
    )
    # Staff sign-in with a provider (apps.identity): superusers only, like the rest.
    GroupMapping.objects.create(group=f"{slug}-ops", tenant=tenant, role=Role.OPERATOR)
    sso = User.objects.create_user(f"{slug}-sso")
    ExternalIdentity.objects.create(
        user=sso, issuer=f"https://{slug}.example", subject=f"{slug}-sub", groups=[f"{slug}-ops"]
    )
    # The tool the walker opens (the first) and the one the rows use.
    for each in {tool, Tool.objects.order_by("pk").first()}:
        assign_perm("tools.execute_tool", group, each)
        assign_perm("tools.decide_approval", member, each)
    assign_perm("connections.use_connection", group, connection)
    return member


def task_result(marker: str) -> DBTaskResult:
    """A queued task of no tenant; its arguments name one."""
    return DBTaskResult.objects.create(
        args_kwargs={"args": [marker], "kwargs": {}},
        task_path=f"tests.{marker}.task",
        backend_name="default",
        run_after=timezone.now(),
        exception_class_path="",
        traceback="",
    )


def build_world() -> World:
    """Tenant globex first (foreign), then acme (own), diffing every registered model."""
    superuser = User.objects.create_superuser("root", password=None)
    for number in (1, 2):  # the catalog is global: imported tools are no tenant's rows
        Tool.objects.create(
            id=f"mcp__srv{number}__tool", name=f"srv{number}__tool", description="imported",
            input_schema={}, schema_hash="", effect="external_side_effect",
            consequence_level="medium", source="mcp",
        )  # fmt: skip
    before = snapshot()
    populate("globex")
    task_result("globex")
    middle = snapshot()
    populate("acme")
    after = snapshot()
    staff = User.objects.create_user("acme-staff", is_staff=True)
    grant_role(staff, Tenant.objects.get(slug="acme"), Role.ADMIN)
    # Every permission there is, so that only tenant scoping can hide the other tenant.
    staff.user_permissions.add(*Permission.objects.all())
    world = World(staff=staff, superuser=superuser)
    for model in registered_models():
        manager = model._default_manager
        world.foreign[model] = list(manager.filter(pk__in=middle[model] - before[model]))
        world.own[model] = list(manager.filter(pk__in=after[model] - middle[model]))
    return world


class FormReader(HTMLParser):
    """What a browser would submit from the admin's main form (id `<model>_form`)."""

    def __init__(self, form_id: str) -> None:
        super().__init__()
        self.form_id = form_id
        self.inside = False
        self.data: list[tuple[str, str]] = []
        self._select: str | None = None
        self._textarea: str | None = None
        self._text = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "form":
            self.inside = a.get("id") == self.form_id
        if not self.inside or ("name" not in a and tag != "option"):
            return
        if tag == "input":
            kind = a.get("type", "text")
            if kind in ("submit", "button", "file", "image"):
                return
            if kind in ("checkbox", "radio") and "checked" not in a:
                return
            self.data.append((a["name"], a.get("value", "on" if kind == "checkbox" else "")))
        elif tag == "select":
            self._select = a["name"]
        elif tag == "option" and self._select is not None and "selected" in a:
            self.data.append((self._select, a.get("value", "")))
        elif tag == "textarea":
            self._textarea, self._text = a["name"], ""

    def handle_data(self, data: str) -> None:
        if self._textarea is not None:
            self._text += data

    def handle_endtag(self, tag: str) -> None:
        if tag == "form":
            self.inside = False
        elif tag == "select":
            self._select = None
        elif tag == "textarea" and self._textarea is not None:
            text = self._text[1:] if self._text.startswith("\n") else self._text
            self.data.append((self._textarea, text))
            self._textarea = None


def form_data(html: str, model: type[Model]) -> dict[str, list[str]]:
    reader = FormReader(f"{model._meta.model_name}_form")
    reader.feed(html)
    data: dict[str, list[str]] = {}
    for name, value in reader.data:
        data.setdefault(name, []).append(value)
    return data


def queries_per_page_size(client: Any, path: str, model_admin: Any) -> list[int]:
    """The queries a changelist takes with 10 rows a page and with 100 (after a warm-up
    each): equal when no row costs a query of its own."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    counts = []
    for per_page in (10, 100):
        model_admin.list_per_page = per_page
        try:
            client.get(path)  # warm
            with CaptureQueriesContext(connection) as queries:
                assert client.get(path).status_code == 200
        finally:
            model_admin.list_per_page = 100
        counts.append(len(queries))
    return counts
